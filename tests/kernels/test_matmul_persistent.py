"""utils.kernels.matmul_persistent: the persistent TMA matmul against torch, through the interpreter on a CPU."""

import pytest
import torch

from utils.device import HAS_CUDA, device, manual_seed
from utils.kernels.matmul_persistent import (DEFAULT_CONFIG, SWEEP_CONFIGS, matmul_fp8, matmul_persistent,
                                             num_programs)

SMALL = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, GROUP_SIZE_M=2, num_warps=4, num_stages=2)


@pytest.mark.parametrize("m, n, k", [(96, 80, 48), (64, 48, 40), (33, 40, 24)])
@pytest.mark.parametrize("subtile", [False, True])
@pytest.mark.parametrize("b_k_major", [False, True])
def test_matches_torch_on_ragged_shapes(m, n, k, subtile, b_k_major):
    """Edges that are not multiples of the tiles: TMA pads loads with zeros and clips stores."""
    manual_seed(0)
    a = torch.randn(m, k, device=device())
    b = torch.randn(n, k, device=device()).T if b_k_major else torch.randn(k, n, device=device())
    c = matmul_persistent(a, b, dict(SMALL, EPILOGUE_SUBTILE=subtile))
    torch.testing.assert_close(c, a @ b, rtol=1e-5, atol=1e-5)


def test_fp16_and_more_tiles_than_programs():
    """Fewer programs than tiles: each program walks several tiles of the grouped order."""
    manual_seed(1)
    a, b = (torch.randn(128, 64, device=device()).half(), torch.randn(64, 96, device=device()).half())
    assert num_programs(128, 96, 32, 32) < 12 or HAS_CUDA
    c = matmul_persistent(a, b, dict(SMALL, EPILOGUE_SUBTILE=False))
    assert c.dtype == torch.float16
    torch.testing.assert_close(c.float(), a.float() @ b.float(), rtol=2e-3, atol=2e-2)


def test_empty_inner_dimension_gives_zeros():
    a, b = torch.randn(16, 0, device=device()), torch.randn(0, 24, device=device())
    assert torch.equal(matmul_persistent(a, b), torch.zeros(16, 24, device=device()))


@pytest.mark.parametrize("a_shape, b_shape, kwargs, match", [
    ((16, 8), (16, 8), {}, "must be \\(M, K\\)"),
    ((16, 12), (12, 8), {}, "16 bytes"),               # 12 fp32 per row of a: 48 bytes, fine; b: 8 * 4 = 32, fine
    ((16, 8), (8, 16), dict(config=dict(DEFAULT_CONFIG, BLOCK_K=24)), "power of two"),
])
def test_bad_input_raises(a_shape, b_shape, kwargs, match):
    a, b = torch.randn(a_shape, device=device()), torch.randn(b_shape, device=device())
    if match == "16 bytes":
        a, b = torch.randn(16, 6, device=device()).half(), torch.randn(6, 8, device=device()).half()
    with pytest.raises(ValueError, match=match):
        matmul_persistent(a, b, **kwargs)


def test_mixed_dtypes_and_fp8_without_a_gpu_are_refused():
    with pytest.raises(ValueError, match="one dtype"):
        matmul_persistent(torch.randn(16, 16, device=device()), torch.randn(16, 16, device=device()).half())
    if not HAS_CUDA:
        with pytest.raises(ValueError, match="CUDA GPU"):
            matmul_fp8(torch.zeros(16, 16), torch.zeros(16, 16), torch.ones(1), torch.ones(1))


def test_sweep_configs_are_valid_tiles():
    for cfg in SWEEP_CONFIGS:
        assert cfg["BLOCK_M"] * cfg["BLOCK_N"] >= 128 * 128 and cfg["num_warps"] in (4, 8)
