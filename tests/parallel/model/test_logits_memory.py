import pytest
import torch
import torch.nn.functional as F

from utils.attention.peak_memory import peak_tensor_bytes
from utils.parallel.model.logits_memory import chunked_cross_entropy, logits_bytes


def test_logits_bytes_is_4bsv_over_t():
    # Llama 3: vocabulary 128,000, sequences of 8,192 tokens (arXiv:2407.21783, Tables 3 and 4)
    assert logits_bytes(1, 8192, 128_000) == 4 * 8192 * 128_000
    assert logits_bytes(2, 8192, 128_000, tp=8) == 2 * 4 * 8192 * 128_000 // 8
    assert logits_bytes(1, 10, 6, element_bytes=2) == 120


def _problem(n=37, h=16, v=50, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(v, h, generator=g, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, targets


@pytest.mark.parametrize("chunk_rows", [1, 5, 37, 100])
def test_loss_and_gradients_match_torch(chunk_rows):
    hidden, weight, targets = _problem()
    ref = F.cross_entropy(hidden @ weight.T, targets)
    ref_gh, ref_gw = torch.autograd.grad(ref, (hidden, weight))
    loss = chunked_cross_entropy(hidden, weight, targets, chunk_rows=chunk_rows)
    gh, gw = torch.autograd.grad(loss, (hidden, weight))
    # the loss is reduced in fp32, so it agrees to fp32's precision; gradients are computed in fp64
    torch.testing.assert_close(loss.double(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gh, ref_gh, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(gw, ref_gw, rtol=1e-5, atol=1e-7)


def test_upstream_gradient_scales_the_result():
    hidden, weight, targets = _problem(dtype=torch.float32)
    (3.0 * chunked_cross_entropy(hidden, weight, targets, chunk_rows=8)).backward()
    gh = hidden.grad.clone()
    hidden.grad = None
    (3.0 * F.cross_entropy(hidden @ weight.T, targets)).backward()
    torch.testing.assert_close(gh, hidden.grad, rtol=1e-4, atol=1e-6)


def test_peak_memory_shrinks_with_the_chunk():
    hidden, weight, targets = _problem(n=512, h=32, v=2000, dtype=torch.float32)

    def full():
        F.cross_entropy(hidden @ weight.T, targets).backward()

    def chunked():
        chunked_cross_entropy(hidden, weight, targets, chunk_rows=64).backward()

    _, full_peak = peak_tensor_bytes(full)
    _, chunked_peak = peak_tensor_bytes(chunked)
    one_logits = logits_bytes(1, 512, 2000)
    assert full_peak >= 2 * one_logits  # logits and their gradient at once
    # two or three 64-row chunks of logits, plus the gradients of hidden and weight
    assert chunked_peak < one_logits / 2 and chunked_peak < full_peak / 5


@pytest.mark.parametrize("change", ["chunk", "shape", "features", "targets_dtype", "targets_range"])
def test_bad_input_raises(change):
    hidden, weight, targets = _problem()
    kwargs = dict(hidden=hidden, weight=weight, targets=targets, chunk_rows=4)
    if change == "chunk":
        kwargs["chunk_rows"] = 0
    elif change == "shape":
        kwargs["hidden"] = hidden[None]
    elif change == "features":
        kwargs["weight"] = weight[:, :-1]
    elif change == "targets_dtype":
        kwargs["targets"] = targets.float()
    else:
        kwargs["targets"] = targets + 1000
    with pytest.raises(ValueError):
        chunked_cross_entropy(**kwargs)
    with pytest.raises(ValueError):
        logits_bytes(1, 8, 10, tp=3)
