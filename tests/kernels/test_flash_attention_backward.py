"""utils.kernels.flash_attention_backward: the fused backward against float64 autograd, and its input checks."""

import math

import pytest
import torch

from utils.attention.flash_reference import attention_reference
from utils.device import INTERPRETER, device, manual_seed
from utils.kernels.flash_attention import FlashAttention
from utils.kernels.flash_attention_backward import (BACKWARD_CONFIGS, DTYPES, backward_flops,
                                                    flash_attention_backward)

TOLERANCE = {torch.float32: dict(rtol=2e-4, atol=2e-4), torch.float16: dict(rtol=2e-2, atol=2e-2),
             torch.bfloat16: dict(rtol=6e-2, atol=6e-2)}


class _Ctx:
    """Stands in for autograd's ctx, to read what FlashAttention.forward saves."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


def _problem(batch, heads, n, d, dtype, causal, sm_scale):
    """Inputs in ``dtype``, O and L from the Triton forward, and float64 autograd's (dQ, dK, dV)."""
    if dtype not in DTYPES:
        pytest.skip(f"{dtype} is not taken on this machine (DTYPES = {DTYPES})")
    manual_seed(0)
    q64, k64, v64, do64 = (torch.randn(batch, heads, n, d, dtype=torch.float64, device=device()) for _ in range(4))
    q64, k64, v64 = (t.requires_grad_() for t in (q64, k64, v64))
    expected = torch.autograd.grad(attention_reference(q64, k64, v64, causal, sm_scale), (q64, k64, v64), do64)
    q, k, v, d_out = (t.detach().to(dtype) for t in (q64, k64, v64, do64))
    ctx = _Ctx()
    out = FlashAttention.forward(ctx, q, k, v, causal, sm_scale, None, None)
    lse = ctx.saved_tensors[4]
    return (q, k, v, out, lse, d_out), expected


def _assert_grads_close(got, expected, dtype):
    for name, g, want in zip("qkv", got, expected):
        assert g.dtype == dtype and g.shape == want.shape
        torch.testing.assert_close(g.double(), want, **TOLERANCE[dtype], msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal, batch, heads, n, d", [(False, 1, 2, 256, 32), (True, 1, 2, 256, 32),
                                                        (True, 2, 1, 128, 64), (False, 2, 1, 128, 16)])
def test_gradients_match_float64_autograd(dtype, causal, batch, heads, n, d):
    args, expected = _problem(batch, heads, n, d, dtype, causal, 1 / math.sqrt(d))
    _assert_grads_close(flash_attention_backward(*args, causal, 1 / math.sqrt(d)), expected, dtype)


@pytest.mark.parametrize("config", BACKWARD_CONFIGS)
@pytest.mark.parametrize("causal", [False, True])
def test_every_sweep_config_is_valid_and_correct(config, causal):
    block_m1, block_n1, block_m2, block_n2, num_warps, num_stages = config
    dtype = DTYPES[0]
    args, expected = _problem(1, 1, 256, 16, dtype, causal, 0.3)
    got = flash_attention_backward(*args, causal, 0.3, block_m1=block_m1, block_n1=block_n1, block_m2=block_m2,
                                   block_n2=block_n2, num_warps=num_warps, num_stages=num_stages)
    _assert_grads_close(got, expected, dtype)


def test_default_config_is_the_first_and_a_finer_diagonal_slice_agrees():
    assert BACKWARD_CONFIGS[0] == (64, 128, 128, 64, 8, 3)
    dtype = DTYPES[0]
    args, expected = _problem(1, 1, 256, 32, dtype, True, 0.2)
    got = flash_attention_backward(*args, True, 0.2, blk_slice_factor=4)
    _assert_grads_close(got, expected, dtype)


def test_the_forward_saves_the_natural_log_sum_exp_of_the_scaled_masked_scores():
    """The contract on ``lse``: float64 ``logsumexp(Q K^T * scale + mask)`` per query row."""
    (q, k, v, out, lse, d_out), _ = _problem(1, 2, 128, 32, DTYPES[0], True, 0.25)
    scores = q.double() @ k.double().transpose(-2, -1) * 0.25
    scores = scores.masked_fill(torch.ones(128, 128, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1).reshape(2, 128), rtol=1e-5, atol=1e-5)


def _zeros(shape=(1, 1, 128, 16), dtype=None):
    dtype = dtype or DTYPES[0]
    t = torch.zeros(shape, dtype=dtype, device=device())
    lse = torch.zeros(shape[0] * shape[1], shape[2], dtype=torch.float32, device=device())
    return [t, t.clone(), t.clone(), t.clone(), lse, t.clone()]


@pytest.mark.parametrize("change, kwargs, match", [
    (lambda a: _zeros((1, 1, 192, 16)), {}, "multiple of 128"),
    (lambda a: _zeros((1, 1, 128, 48)), {}, "head_dim must be one of"),
    (lambda a: _zeros((1, 1, 128, 256)), {}, "head_dim must be one of"),
    (lambda a: a[:1] + [a[1][:, :, :64].clone()] + a[2:], {}, "k must match q's shape"),
    (lambda a: a[:4] + [a[4][:, :64].clone()] + a[5:], {}, "lse must be float32"),
    (lambda a: a[:4] + [a[4].double()] + a[5:], {}, "lse must be float32"),
    (lambda a: a[:5] + [a[5].transpose(2, 3).contiguous().transpose(2, 3)], {}, "d_out must be contiguous"),
    (lambda a: [t.to(torch.float64) if t.dim() == 4 else t for t in a], {}, "is not supported here"),
    (lambda a: a, dict(block_m1=24), "power of two"),
    (lambda a: a, dict(block_n1=64), "block_n1 and block_m2 must be equal"),
    (lambda a: a, dict(block_m1=16), r"block_m1 // blk_slice_factor"),
    (lambda a: _zeros((1, 1, 128, 16)), dict(block_n1=256, block_m2=256), "multiple of block_n1"),
])
def test_bad_input_raises(change, kwargs, match):
    with pytest.raises(ValueError, match=match):
        flash_attention_backward(*change(_zeros()), True, 0.25, **kwargs)


def test_bad_scale_and_flag_raise():
    with pytest.raises(ValueError, match="sm_scale"):
        flash_attention_backward(*_zeros(), False, 0.0)
    with pytest.raises(ValueError, match="causal must be True or False"):
        flash_attention_backward(*_zeros(), 1, 0.25)


@pytest.mark.skipif(not INTERPRETER, reason="bf16 is refused only by Triton's interpreter")
def test_bfloat16_is_refused_by_the_interpreter():
    with pytest.raises(ValueError, match="bfloat16 is not supported"):
        flash_attention_backward(*[t.bfloat16() if t.dim() == 4 else t for t in _zeros()], False, 0.25)


def test_backward_flops_is_five_matmuls_of_2_n2_d():
    b, h, n, d = 4, 16, 4096, 128
    by_hand = b * h * 5 * (2 * n * n * d)  # S, dP, dV, dK, dQ
    assert backward_flops(b, h, n, d, causal=False) == by_hand
    assert backward_flops(b, h, n, d, causal=True) == by_hand / 2
    assert backward_flops(1, 1, 128, 64, False) == 2.5 * (4 * 128 * 128 * 64)  # 2.5 x the forward's 4 n^2 d
    with pytest.raises(ValueError, match="n must be a positive int"):
        backward_flops(1, 1, 0, 64, False)
