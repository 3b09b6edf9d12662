"""utils.kernels.flash_attention_hopper: the TMA forward (and its autograd path) against a float64 reference."""

import pytest
import torch

from utils.attention.flash_reference import attention_reference
from utils.device import device, manual_seed
from utils.kernels.flash_attention_hopper import SWEEP_CONFIGS, TUNED_CONFIGS, flash_attention_hopper, flash_forward

TOLERANCE = {torch.float32: dict(rtol=2e-4, atol=2e-4), torch.float16: dict(rtol=2e-2, atol=2e-2)}


def _qkv(batch, heads, n, d, seed=0):
    manual_seed(seed)
    return [torch.randn(batch, heads, n, d, dtype=torch.float64, device=device()) for _ in range(3)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("config", [(64, 32, 4, 1), (32, 32, 4, 1)])
def test_forward_and_log_sum_exp_match_float64(dtype, causal, config):
    q, k, v = _qkv(1, 2, 256, 32)
    out, lse = flash_forward(q.to(dtype), k.to(dtype), v.to(dtype), causal, config=config)
    torch.testing.assert_close(out.double(), attention_reference(q, k, v, causal), **TOLERANCE[dtype])
    scores = (q @ k.transpose(-1, -2)) / 32 ** 0.5
    if causal:
        scores = scores.masked_fill(torch.ones(256, 256, dtype=torch.bool, device=device()).triu(1), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, -1).reshape(2, 256), **TOLERANCE[dtype])


def test_custom_scale_and_the_default_config():
    q, k, v = (t.float() for t in _qkv(2, 1, 128, 16, seed=1))
    out, _ = flash_forward(q, k, v, causal=True, sm_scale=0.3)
    torch.testing.assert_close(out, attention_reference(q, k, v, causal=True, sm_scale=0.3), rtol=2e-4, atol=2e-4)


def test_gradients_through_the_fused_backward():
    q64, k64, v64 = (t.requires_grad_() for t in _qkv(1, 1, 128, 16, seed=2))
    d_out = torch.randn(1, 1, 128, 16, dtype=torch.float64, device=device())
    expected = torch.autograd.grad(attention_reference(q64, k64, v64, True), (q64, k64, v64), d_out)
    q, k, v = (t.detach().float().requires_grad_() for t in (q64, k64, v64))
    grads = torch.autograd.grad(flash_attention_hopper(q, k, v, causal=True), (q, k, v), d_out.float())
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got.double(), want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("shape, kwargs, match", [
    ((1, 1, 100, 16), {}, "multiple of 128"),
    ((1, 1, 128, 24), {}, "head_dim must be one of"),
    ((1, 1, 128, 16), dict(config=(128, 256, 4, 3)), "multiple of BLOCK_N"),
])
def test_bad_input_raises(shape, kwargs, match):
    q = torch.zeros(shape, device=device())
    with pytest.raises(ValueError, match=match):
        flash_forward(q, q, q, **kwargs)


def test_tuned_configs_come_from_the_sweep_space():
    assert set(TUNED_CONFIGS) <= set(SWEEP_CONFIGS)
    assert all(bm % bn == 0 and 128 % bm == 0 for bm, bn, _, _ in SWEEP_CONFIGS)
