"""utils.kernels.llama_ops: RMSNorm (forward and backward), RoPE and the SwiGLU gate against torch references."""

import pytest
import torch
import torch.nn.functional as F

from utils.attention.llama import apply_rope, rms_norm as rms_norm_reference, rope_angles
from utils.attention.rope import neox_permutation
from utils.device import device, manual_seed
from utils.kernels.llama_ops import rms_norm, rope, swiglu_gate

TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 1), (3, 100), (2, 5, 64), (70, 33)])
def test_rms_norm_forward_and_backward_match_torch(shape, dtype):
    manual_seed(0)
    x64 = torch.randn(shape, dtype=torch.float64, device=device(), requires_grad=True)
    w64 = (1 + 0.1 * torch.randn(shape[-1], dtype=torch.float64, device=device())).requires_grad_()
    dy = torch.randn(shape, dtype=torch.float64, device=device())
    expected = rms_norm_reference(x64, w64)
    dx_ref, dw_ref = torch.autograd.grad(expected, (x64, w64), dy)
    x, w = (t.detach().to(dtype).requires_grad_() for t in (x64, w64))
    y = rms_norm(x, w)
    dx, dw = torch.autograd.grad(y, (x, w), dy.to(dtype))
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(y.double(), expected, **tol)
    torch.testing.assert_close(dx.double(), dx_ref, **tol)
    torch.testing.assert_close(dw.double(), dw_ref, rtol=tol["rtol"] * 10, atol=tol["atol"] * shape[0] * 10)


@pytest.mark.parametrize("layout", ["interleaved", "neox"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 1, 5, 2), (2, 3, 17, 64), (1, 4, 9, 6)])
def test_rope_matches_the_reference(shape, dtype, layout):
    manual_seed(0)
    x = torch.randn(shape, device=device()).to(dtype)
    cos, sin = (t.to(device()) for t in rope_angles(shape[-2], shape[-1]))
    torch.testing.assert_close(rope(x, cos, sin, layout), apply_rope(x, cos, sin, layout), **TOLERANCE[dtype])


def test_rope_layouts_agree_after_the_permutation():
    manual_seed(0)
    x = torch.randn(2, 2, 7, 16, device=device())
    cos, sin = (t.to(device()) for t in rope_angles(7, 16))
    perm = neox_permutation(16).to(device())
    torch.testing.assert_close(rope(x[..., perm].contiguous(), cos, sin, "neox"), rope(x, cos, sin)[..., perm])
    assert (rope(x, cos, sin, "neox") - rope(x, cos, sin)).abs().max() > 0.1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n", [1, 1000, 4097])
def test_swiglu_gate_matches_torch(n, dtype):
    manual_seed(0)
    a, b = (torch.randn(n, device=device()).to(dtype) for _ in range(2))
    expected = (F.silu(a.float()) * b.float()).to(dtype)
    torch.testing.assert_close(swiglu_gate(a, b, block_size=256), expected, **TOLERANCE[dtype])


def test_bad_input_raises():
    x = torch.randn(4, 8, device=device())
    with pytest.raises(ValueError, match="weight must have shape"):
        rms_norm(x, torch.ones(7, device=device()))
    with pytest.raises(ValueError, match="contiguous"):
        rms_norm(x.t(), torch.ones(4, device=device()))
    with pytest.raises(ValueError, match="cos must be float32 of shape"):
        rope(x.view(1, 4, 8), torch.ones(4, 3, device=device()), torch.ones(4, 4, device=device()))
    with pytest.raises(ValueError, match="layout must be one of"):
        rope(x.view(1, 4, 8), torch.ones(4, 4, device=device()), torch.ones(4, 4, device=device()), layout="gptj")
    with pytest.raises(ValueError, match="even head_dim"):
        rope(torch.randn(4, 7, device=device()), torch.ones(4, 3), torch.ones(4, 3))
    with pytest.raises(ValueError, match="same shape"):
        swiglu_gate(x, x[:2])
