"""utils.kernels.fused_linear_cross_entropy: loss and both gradients against F.cross_entropy, and the logits it holds.

Tolerances, against ``F.cross_entropy(hidden @ weight.T, targets)`` computed in float64 on the same inputs:
fp32: ``rtol=1e-5, atol=1e-6`` on the loss and every gradient entry (the entries are 1e-3 to 1e-1);
bf16: the loss within ``1e-3`` relative, each gradient within ``2e-2`` of its largest entry, absolute
(bf16 logits and a bf16 gradient of the logits carry 8 bits of mantissa). Measured on a CPU for the bf16 test's
inputs: 6e-5 on the loss, 0.75% and 0.53% on grad_hidden and grad_weight; PyTorch's own bf16
``F.cross_entropy`` on the same inputs: 1.7e-3 (it rounds the loss to bf16), 0.80% and 0.43%.
"""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from utils.device import device, manual_seed
from utils.kernels import fused_linear_cross_entropy as flce
from utils.kernels.fused_linear_cross_entropy import MAX_BLOCK_SIZE, fused_linear_cross_entropy, peak_logits_nbytes
from utils.production.fused_training import LargestTensors
from utils.parallel.model.logits_memory import chunked_cross_entropy

FP32 = dict(rtol=1e-5, atol=1e-6)
BF16_LOSS_RTOL = 1e-3
BF16_GRAD_ATOL_OF_MAX = 2e-2


def _problem(tokens, vocab, d, dtype=torch.float32, seed=0, ignored=()):
    manual_seed(seed)
    hidden = torch.randn(tokens, d, device=device()).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, d, device=device()) / d**0.5 * 2).to(dtype).requires_grad_()  # logits of order 2
    targets = torch.randint(0, vocab, (tokens,), device=device())
    targets[list(ignored)] = -100
    return hidden, weight, targets


def _reference(hidden, weight, targets, ignore_index=-100, scale=1.0):
    """Loss, grad_hidden, grad_weight of the unfused loss in float64 on the same (rounded) inputs."""
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    loss = F.cross_entropy(h @ w.T, targets, ignore_index=ignore_index)
    (loss * scale).backward()
    return loss.detach(), h.grad, w.grad


def _fused(hidden, weight, targets, scale=1.0, **kwargs):
    hidden.grad = weight.grad = None
    loss = fused_linear_cross_entropy(hidden, weight, targets, **kwargs)
    (loss * scale).backward()
    return loss.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("tokens,chunk_size", [(24, 8), (29, 8), (29, 1), (29, 64)])  # divides, not, 1 row, > tokens
@pytest.mark.parametrize("vocab", [257, 1000])
def test_fp32_loss_and_gradients_equal_f_cross_entropy(tokens, chunk_size, vocab):
    hidden, weight, targets = _problem(tokens, vocab, 16)
    loss, g_hidden, g_weight = _fused(hidden, weight, targets, chunk_size=chunk_size)
    want_loss, want_hidden, want_weight = _reference(hidden, weight, targets)
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert g_hidden.dtype == g_weight.dtype == torch.float32
    torch.testing.assert_close(loss.double(), want_loss, **FP32)
    torch.testing.assert_close(g_hidden.double(), want_hidden, **FP32)
    torch.testing.assert_close(g_weight.double(), want_weight, **FP32)


def test_bf16_within_the_stated_tolerance():
    hidden, weight, targets = _problem(37, 1000, 32, torch.bfloat16, ignored=(5,))
    loss, g_hidden, g_weight = _fused(hidden, weight, targets, chunk_size=16)
    want_loss, want_hidden, want_weight = _reference(hidden, weight, targets)
    assert loss.dtype == torch.float32 and g_hidden.dtype == g_weight.dtype == torch.bfloat16
    torch.testing.assert_close(loss.double(), want_loss, rtol=BF16_LOSS_RTOL, atol=0)
    for got, want in ((g_hidden, want_hidden), (g_weight, want_weight)):
        torch.testing.assert_close(got.double(), want, rtol=0, atol=BF16_GRAD_ATOL_OF_MAX * want.abs().max().item())


def test_a_vocab_past_one_block_and_the_books_chunked_loss():
    hidden, weight, targets = _problem(6, MAX_BLOCK_SIZE + 3, 8)  # the row loop's second block holds 3 logits
    loss, g_hidden, g_weight = _fused(hidden, weight, targets, chunk_size=4)
    want_loss, want_hidden, want_weight = _reference(hidden, weight, targets)
    torch.testing.assert_close(loss.double(), want_loss, **FP32)
    torch.testing.assert_close(g_hidden.double(), want_hidden, **FP32)
    torch.testing.assert_close(g_weight.double(), want_weight, **FP32)
    book = chunked_cross_entropy(hidden, weight, targets, chunk_rows=4)  # utils.parallel.model.logits_memory
    torch.testing.assert_close(loss, book.detach(), rtol=1e-6, atol=1e-6)


def test_online_softmax_over_many_blocks_is_safe_for_logits_that_overflow_exp(monkeypatch):
    monkeypatch.setattr(flce, "MAX_BLOCK_SIZE", 16)  # vocab 100: seven blocks per row, the last one partial
    hidden, weight, targets = _problem(10, 100, 8)
    ones = torch.ones(10, 1, device=device())
    shifted = []
    for shift in (0.0, 1000.0):  # a constant feature times a constant column adds `shift` to every logit
        h = torch.cat([hidden.detach(), ones], 1).requires_grad_()
        w = torch.cat([weight.detach(), torch.full((100, 1), shift, device=device())], 1).requires_grad_()
        shifted.append(_fused(h, w, targets, chunk_size=4))
    assert not torch.isfinite(torch.exp(torch.tensor(1000.0)))
    want_loss, want_hidden, want_weight = _reference(hidden, weight, targets)
    for loss, g_hidden, g_weight in shifted:  # cross-entropy does not change when every logit moves together
        torch.testing.assert_close(loss.double(), want_loss, rtol=0, atol=1e-3)
        torch.testing.assert_close(g_hidden[:, :8].double(), want_hidden, rtol=0, atol=1e-3)
        torch.testing.assert_close(g_weight[:, :8].double(), want_weight, rtol=0, atol=1e-3)
    torch.testing.assert_close(shifted[0][0].double(), want_loss, **FP32)


@settings(max_examples=12, deadline=None)
@given(tokens=st.integers(1, 12), vocab=st.integers(1, 150), chunk_size=st.integers(1, 14), seed=st.integers(0, 99))
def test_any_chunking_gives_the_unchunked_loss(tokens, vocab, chunk_size, seed):
    hidden, weight, targets = _problem(tokens, vocab, 4, seed=seed)
    loss, g_hidden, g_weight = _fused(hidden, weight, targets, chunk_size=chunk_size)
    want_loss, want_hidden, want_weight = _reference(hidden, weight, targets)
    torch.testing.assert_close(loss.double(), want_loss, **FP32)
    torch.testing.assert_close(g_hidden.double(), want_hidden, **FP32)
    torch.testing.assert_close(g_weight.double(), want_weight, **FP32)


@pytest.mark.parametrize("ignore_index", [-100, 0])  # the default, and a pad id inside the vocabulary
def test_ignored_tokens_contribute_nothing_and_the_mean_is_over_the_others(ignore_index):
    hidden, weight, targets = _problem(20, 300, 8)
    targets[[1, 7, 8, 19]] = ignore_index
    loss, g_hidden, g_weight = _fused(hidden, weight, targets, chunk_size=6, ignore_index=ignore_index)
    want_loss, want_hidden, want_weight = _reference(hidden, weight, targets, ignore_index=ignore_index)
    torch.testing.assert_close(loss.double(), want_loss, **FP32)
    torch.testing.assert_close(g_hidden.double(), want_hidden, **FP32)
    torch.testing.assert_close(g_weight.double(), want_weight, **FP32)
    assert (g_hidden[[1, 7, 8, 19]] == 0).all()


def test_every_token_ignored_gives_nan_and_zero_gradients_as_pytorch_does():
    hidden, weight, targets = _problem(5, 50, 4, ignored=range(5))
    loss, g_hidden, g_weight = _fused(hidden, weight, targets, chunk_size=2)
    want_loss, _, _ = _reference(hidden, weight, targets)
    assert torch.isnan(loss) and torch.isnan(want_loss)
    assert (g_hidden == 0).all() and (g_weight == 0).all()


def test_gradients_scale_with_grad_output_and_survive_a_second_backward():
    hidden, weight, targets = _problem(13, 200, 8)
    _, want_hidden, want_weight = _reference(hidden, weight, targets, scale=3.0)
    _, g_hidden, g_weight = _fused(hidden, weight, targets, scale=3.0, chunk_size=5)  # (loss * 3).backward()
    torch.testing.assert_close(g_hidden.double(), want_hidden, **FP32)
    torch.testing.assert_close(g_weight.double(), want_weight, **FP32)
    hidden.grad = weight.grad = None
    loss = fused_linear_cross_entropy(hidden, weight, targets, chunk_size=5)
    (2 * loss).backward(retain_graph=True)
    (loss * 1).backward()  # the stored gradients were not scaled in place: 2 g + g
    torch.testing.assert_close(hidden.grad.double(), want_hidden, **FP32)
    torch.testing.assert_close(weight.grad.double(), want_weight, **FP32)


def test_only_what_requires_grad_gets_a_gradient_and_no_grad_gives_the_same_loss():
    hidden, weight, targets = _problem(9, 120, 8)
    frozen = weight.detach()
    _, g_hidden, _ = _fused(hidden, frozen, targets.int(), chunk_size=4)  # int32 targets are accepted too
    _, want_hidden, _ = _reference(hidden, frozen, targets)
    torch.testing.assert_close(g_hidden.double(), want_hidden, **FP32)
    assert frozen.grad is None
    with torch.no_grad():
        loss = fused_linear_cross_entropy(hidden, weight, targets, chunk_size=4)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss.double(), _reference(hidden, weight, targets)[0], **FP32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_tensor_larger_than_chunk_size_by_vocab_is_ever_made(dtype):
    tokens, vocab, d, chunk_size = 48, 500, 4, 8  # chunk x V = 4,000 logits; tokens x V = 24,000; V x d = 2,000
    hidden, weight, targets = _problem(tokens, vocab, d, dtype)
    with LargestTensors() as fused:
        fused_linear_cross_entropy(hidden, weight, targets, chunk_size=chunk_size).backward()
    with LargestTensors() as unfused:  # the probe sees the full logits when they exist
        F.cross_entropy(hidden @ weight.T, targets).backward()
    element = torch.empty((), dtype=dtype).element_size()
    assert fused.largest_nbytes() == chunk_size * vocab * 4  # the fp32 buffer
    assert unfused.largest_nbytes() >= tokens * vocab * element > 2 * fused.largest_nbytes()
    held = sum(fused.largest_nbytes(dt) for dt in {torch.float32, dtype})  # bf16: the buffer and its bf16 twin
    assert held == peak_logits_nbytes(tokens, vocab, chunk_size, dtype)


def test_peak_logits_nbytes_formula():
    vocab = 128_000  # Llama 3 (arXiv:2407.21783, Table 3), one 8,192-token sequence
    assert peak_logits_nbytes(8192, vocab, 1024, fused=False) == 4 * 8192 * vocab  # 4.2 GB
    assert peak_logits_nbytes(8192, vocab, 1024) == 1024 * vocab * 4  # 0.52 GB: 8 times less
    assert peak_logits_nbytes(8192, vocab, 1024, torch.bfloat16) == 1024 * vocab * 6
    assert peak_logits_nbytes(100, vocab, 1024) == 100 * vocab * 4  # a chunk never exceeds the tokens
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        peak_logits_nbytes(10, 10, 0)
    with pytest.raises(ValueError, match="dtype must be"):
        peak_logits_nbytes(10, 10, 2, torch.float16)


def _inputs(hidden=(6, 4), weight=(10, 4), targets=6, dtype=torch.float32, target_dtype=torch.int64):
    d = device()
    return (torch.randn(*hidden, device=d).to(dtype), torch.randn(*weight, device=d).to(dtype),
            torch.zeros(targets, device=d, dtype=target_dtype))


@pytest.mark.parametrize("make, kwargs, message", [
    (lambda: _inputs(hidden=(2, 3, 4)), {}, r"hidden must be \(tokens, d\)"),
    (lambda: _inputs(weight=(40,)), {}, r"weight \(vocab, d\)"),
    (lambda: _inputs()[:2] + (torch.zeros(6, 1, dtype=torch.int64, device=device()),), {}, r"targets \(tokens,\)"),
    (lambda: _inputs(weight=(10, 5)), {}, "d = 4 features but weight has 5"),
    (lambda: _inputs(targets=5), {}, "one target per token"),
    (lambda: _inputs(hidden=(0, 4), targets=0), {}, "empty input"),
    (lambda: _inputs(weight=(0, 4)), {}, "empty input"),
    (lambda: _inputs(hidden=(6, 0), weight=(10, 0)), {}, "empty input"),
    (lambda: _inputs(dtype=torch.float16), {}, "torch.float32 or torch.bfloat16"),
    (lambda: _inputs(dtype=torch.float64), {}, "torch.float32 or torch.bfloat16"),
    (lambda: (_inputs()[0], _inputs(dtype=torch.bfloat16)[1], _inputs()[2]), {}, "share one dtype"),
    (lambda: _inputs(target_dtype=torch.float32), {}, "integer class indices"),
    (lambda: _inputs()[:2] + (torch.full((6,), 10, device=device()),), {}, r"\[0, 10\).*found 10"),
    (lambda: _inputs()[:2] + (torch.full((6,), -1, device=device()),), {}, "or equal ignore_index = -100; found -1"),
    (lambda: _inputs()[:2] + (torch.full((6,), -100, device=device()),), dict(ignore_index=-1), "found -100"),
    (lambda: _inputs(), dict(chunk_size=0), "chunk_size must be a positive int, got 0"),
    (lambda: _inputs(), dict(chunk_size=-3), "chunk_size must be a positive int"),
    (lambda: _inputs(), dict(chunk_size=2.5), "chunk_size must be a positive int"),
    (lambda: _inputs(), dict(chunk_size=True), "chunk_size must be a positive int"),
    (lambda: _inputs(), dict(ignore_index=1.5), "ignore_index must be an int"),
    (lambda: ([[1.0] * 4] * 6,) + _inputs()[1:], {}, "hidden is a list, expected a torch.Tensor"),
    (lambda: (_inputs()[0].to("meta"),) + _inputs()[1:], {}, "hidden is on meta"),
    (lambda: _inputs()[:2] + (_inputs()[2].to("meta"),), {}, "targets is on meta"),
])
def test_bad_input_is_a_value_error_that_says_what_is_allowed(make, kwargs, message):
    with pytest.raises(ValueError, match=message):
        fused_linear_cross_entropy(*make(), **kwargs)
