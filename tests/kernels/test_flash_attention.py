"""utils.kernels.flash_attention: the Triton forward and backward against a float64 reference, on odd shapes."""

import pytest
import torch

from utils.attention.flash_reference import attention_reference
from utils.device import device, manual_seed
from utils.kernels.flash_attention import flash_attention

TOLERANCE = {torch.float32: dict(rtol=2e-4, atol=2e-4), torch.float16: dict(rtol=2e-2, atol=2e-2)}


def _inputs(batch, heads, n_q, n_k, d, dtype):
    manual_seed(0)
    shapes = ((batch, heads, n_q, d), (batch, heads, n_k, d), (batch, heads, n_k, d))
    return [torch.randn(s, dtype=torch.float64, device=device()) for s in shapes]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("causal, n_q, n_k, d", [(False, 37, 53, 16), (True, 45, 45, 64), (False, 20, 20, 128),
                                                  (True, 16, 16, 32)])
def test_forward_and_gradients_match_float64(dtype, causal, n_q, n_k, d):
    q64, k64, v64 = (t.requires_grad_() for t in _inputs(2, 2, n_q, n_k, d, dtype))
    d_out = torch.randn(2, 2, n_q, d, dtype=torch.float64, device=device())
    expected = attention_reference(q64, k64, v64, causal)
    expected_grads = torch.autograd.grad(expected, (q64, k64, v64), d_out)
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q64, k64, v64))
    out = flash_attention(q, k, v, causal=causal, block_m=16, block_n=16)
    assert out.dtype == dtype and out.shape == q.shape
    grads = torch.autograd.grad(out, (q, k, v), d_out.to(dtype))
    torch.testing.assert_close(out.double(), expected, **TOLERANCE[dtype])
    for name, got, want in zip("qkv", grads, expected_grads):
        torch.testing.assert_close(got.double(), want, **TOLERANCE[dtype], msg=lambda m, n=name: f"d{n}: {m}")


def test_default_tiles_and_a_custom_scale():
    q, k, v = (t.float() for t in _inputs(1, 3, 70, 70, 16, torch.float32))
    out = flash_attention(q, k, v, causal=True, sm_scale=0.5)
    torch.testing.assert_close(out, attention_reference(q, k, v, causal=True, sm_scale=0.5), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("shapes, kwargs, match", [
    (((1, 1, 8, 24), (1, 1, 8, 24), (1, 1, 8, 24)), {}, "head_dim must be one of"),
    (((1, 1, 8, 16), (1, 1, 9, 16), (1, 1, 8, 16)), {}, "do not match"),
    (((1, 1, 8, 16), (1, 1, 9, 16), (1, 1, 9, 16)), dict(causal=True), "causal"),
    (((1, 1, 8, 16), (1, 1, 8, 16), (1, 1, 8, 16)), dict(block_m=24), "power of two"),
])
def test_bad_input_raises(shapes, kwargs, match):
    q, k, v = (torch.zeros(s, device=device()) for s in shapes)
    with pytest.raises(ValueError, match=match):
        flash_attention(q, k, v, **kwargs)


def test_the_package_exports_the_launcher():
    """Part 3's API: ``utils.kernels.flash_attention(q, k, v, causal=False, sm_scale=None)``."""
    import utils.kernels

    q, k, v = (t.float() for t in _inputs(1, 1, 20, 20, 16, torch.float32))
    assert utils.kernels.flash_attention is flash_attention
    torch.testing.assert_close(utils.kernels.flash_attention(q, k, v, causal=True),
                               attention_reference(q, k, v, causal=True), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("n, block_m, block_n", [(64, 16, 16), (70, 32, 16), (45, 16, 32)])
def test_causal_diagonal_split_equals_the_masked_loop(n, block_m, block_n):
    """Unmasked tiles left of the diagonal plus a masked diagonal, heavy tiles first: the same numbers as masking all."""
    q, k, v = (t.float() for t in _inputs(1, 2, n, n, 32, torch.float32))
    split = flash_attention(q, k, v, causal=True, block_m=block_m, block_n=block_n)
    masked = flash_attention(q, k, v, causal=True, block_m=block_m, block_n=block_n, split_diagonal=False)
    assert torch.equal(split, masked)  # an unmasked tile computes the same scores, in the same order
    torch.testing.assert_close(split, attention_reference(q, k, v, causal=True), rtol=2e-4, atol=2e-4)
    with pytest.raises(ValueError, match="split_diagonal"):
        flash_attention(q, k, v, causal=True, split_diagonal="yes")


@pytest.mark.parametrize("causal, heads, kv_heads, n", [(False, 4, 2, 37), (True, 4, 1, 45), (True, 8, 2, 33)])
def test_gqa_packed_forward_and_gradients_match_expanded_kv(causal, heads, kv_heads, n):
    """One program per group of query heads: the same result as attention with K/V repeated per query head."""
    manual_seed(0)
    q64 = torch.randn(2, heads, n, 32, dtype=torch.float64, device=device(), requires_grad=True)
    k64, v64 = (torch.randn(2, kv_heads, n, 32, dtype=torch.float64, device=device(), requires_grad=True)
                for _ in range(2))
    d_out = torch.randn(2, heads, n, 32, dtype=torch.float64, device=device())
    g = heads // kv_heads
    expected = attention_reference(q64, k64.repeat_interleave(g, 1), v64.repeat_interleave(g, 1), causal)
    expected_grads = torch.autograd.grad(expected, (q64, k64, v64), d_out)
    q, k, v = (t.detach().float().requires_grad_() for t in (q64, k64, v64))
    out = flash_attention(q, k, v, causal=causal, block_m=16, block_n=16)
    grads = torch.autograd.grad(out, (q, k, v), d_out.float())
    torch.testing.assert_close(out.double(), expected, rtol=2e-4, atol=2e-4)
    for name, got, want in zip("qkv", grads, expected_grads):
        assert got.shape == want.shape
        torch.testing.assert_close(got.double(), want, rtol=2e-4, atol=2e-4, msg=lambda m, n=name: f"d{n}: {m}")


def test_gqa_group_must_be_a_power_of_two():
    q = torch.zeros(1, 6, 8, 16, device=device())
    k = torch.zeros(1, 2, 8, 16, device=device())
    with pytest.raises(ValueError, match="power of two"):
        flash_attention(q, k, k)
