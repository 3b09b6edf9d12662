import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from utils import device
from utils.kernels.matmul import (blocks_loaded, launch_order, matmul, tile_intensity, tile_order, tile_smem_bytes,
                                  working_set_bytes)

DEV = device.device()
# fp16 output: the atol of Triton's matmul tutorial, plus one rounding of the fp32 sum (2^-11 relative).
# fp32: exact-ish in the interpreter; on a GPU tl.dot rounds fp32 inputs to TF32 (10-bit mantissa).
TOL = {torch.float16: dict(atol=1e-2, rtol=1e-3),
       torch.float32: dict(atol=5e-2, rtol=1e-2) if device.HAS_CUDA else dict(atol=1e-4, rtol=1e-4)}


def _pair(m, n, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(dtype).to(DEV)
    b = torch.randn(k, n, generator=g).to(dtype).to(DEV)
    return a, b


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("m, n, k, group_size_m", [
    (64, 64, 64, 1),  # multiples of the tile
    (100, 72, 50, 3),  # every edge masked; 4 tile rows in groups of 3: a short last group
    (33, 17, 40, 8),  # fewer tile rows than the group size
])
def test_matches_torch_matmul_on_shapes_that_are_not_tile_multiples(dtype, m, n, k, group_size_m):
    a, b = _pair(m, n, k, dtype)
    c = matmul(a, b, block_m=32, block_n=32, block_k=32, group_size_m=group_size_m)
    assert c.shape == (m, n) and c.dtype == dtype
    torch.testing.assert_close(c.float(), torch.matmul(a.float(), b.float()), **TOL[dtype])


def test_strided_inputs_and_small_tiles():
    a, b = _pair(40, 24, 48, torch.float32, seed=1)
    bt = b.t().contiguous().t()  # same values, column-major strides
    c = matmul(a, bt, block_m=16, block_n=16, block_k=16, group_size_m=3)
    torch.testing.assert_close(c, a @ b, **TOL[torch.float32])


def test_empty_inner_dimension_gives_zeros():
    a = torch.ones(3, 0, device=DEV)
    b = torch.ones(0, 5, device=DEV)
    torch.testing.assert_close(matmul(a, b, 16, 16, 16), torch.zeros(3, 5, device=DEV))


@pytest.mark.parametrize("call, match", [
    (lambda: matmul(torch.ones(4, 3, device=DEV), torch.ones(4, 2, device=DEV)), "inner dimensions"),
    (lambda: matmul(torch.ones(4, device=DEV), torch.ones(4, 2, device=DEV)), "2-D"),
    (lambda: matmul(torch.ones(4, 4, device=DEV), torch.ones(4, 4, device=DEV, dtype=torch.float16)), "same dtype"),
    (lambda: matmul(torch.ones(4, 4, device=DEV, dtype=torch.float64),
                    torch.ones(4, 4, device=DEV, dtype=torch.float64)), "not supported"),
    (lambda: matmul(torch.ones(4, 4, device=DEV), torch.ones(4, 4, device=DEV), block_m=24), "power of two"),
    (lambda: matmul(torch.ones(4, 4, device=DEV), torch.ones(4, 4, device=DEV), block_k=8), ">= 16"),
    (lambda: matmul(torch.ones(4, 4, device=DEV), torch.ones(4, 4, device=DEV), group_size_m=0), "group_size_m"),
    (lambda: matmul(torch.ones(4, 4, device=DEV), torch.ones(4, 4, device=DEV), num_warps=3), "num_warps"),
    (lambda: matmul(torch.ones(4, 4, device=DEV), torch.ones(4, 4, device=DEV), num_stages=0), "num_stages"),
    (lambda: tile_intensity(128, 128, 64, 3), "element_size"),
    (lambda: tile_order(9, 3, 3, 1), "pid"),
    (lambda: blocks_loaded(3, 3, 3, 1, 10), "n_programs"),
    (lambda: working_set_bytes(64, 64, 64, 32, 32, 1, 5, 2), "n_programs"),
])
def test_bad_input_raises_with_a_reason(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.skipif(not device.INTERPRETER, reason="bf16 is refused only under the interpreter")
def test_bfloat16_is_refused_under_the_interpreter():
    a = torch.ones(16, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16"):
        matmul(a, a, 16, 16, 16)


def test_grouping_matches_triton_tutorial_figure():
    # Triton tutorial "Matrix Multiplication", L2 Cache Optimizations: 9 x 9 blocks, first 9 tiles.
    assert blocks_loaded(9, 9, 9, group_size_m=1, n_programs=9) == 90
    assert blocks_loaded(9, 9, 9, group_size_m=3, n_programs=9) == 54


def test_working_set_of_the_first_wave_on_an_h100():
    # 4096^3 fp16 with 128 x 256 tiles: 32 x 16 tiles; 132 programs (one per SM) run at once.
    # Row-major: rows 0..8 of A (9 x 1 MiB) and all 16 column panels of B (16 x 2 MiB).
    assert working_set_bytes(4096, 4096, 4096, 128, 256, 1, 132, 2) == (9 * 1 + 16 * 2) * 2**20
    # Groups of 8 rows: 128 programs cover rows 0..7, the next 4 rows 8..11 of column 0.
    assert working_set_bytes(4096, 4096, 4096, 128, 256, 8, 132, 2) == (12 * 1 + 16 * 2) * 2**20


@settings(max_examples=30)
@given(st.integers(1, 8), st.integers(1, 8), st.integers(1, 9), st.integers(0, 64))
def test_working_set_agrees_with_blocks_loaded_for_square_blocks(pm, pn, group, n_programs):
    n_programs = min(n_programs, pm * pn)
    blocks = blocks_loaded(pm, pn, 3, group, n_programs)
    assert working_set_bytes(pm * 16, pn * 16, 48, 16, 16, group, n_programs, 2) == blocks * 16 * 16 * 2


def test_tile_intensity_of_a_128_square_fp16_tile_is_64_flops_per_byte():
    # 2 * 128 * 128 * 64 FLOPs over (128 * 64 + 64 * 128) * 2 bytes.
    assert tile_intensity(128, 128, 64, 2) == pytest.approx(64.0)
    assert tile_intensity(128, 256, 64, 2) == pytest.approx(2 * 128 * 256 / (384 * 2))
    assert tile_smem_bytes(128, 256, 64, 2, num_stages=3) == 144 * 1024


@given(st.integers(1, 512), st.integers(1, 512), st.integers(1, 512), st.sampled_from([1, 2, 4]))
def test_tile_intensity_does_not_depend_on_block_k(bm, bn, bk, size):
    assert tile_intensity(bm, bn, bk, size) == pytest.approx(2 * bm * bn / ((bm + bn) * size))


@settings(max_examples=60)
@given(st.integers(1, 12), st.integers(1, 12), st.integers(1, 14))
def test_launch_order_visits_every_tile_once(num_pid_m, num_pid_n, group_size_m):
    order = launch_order(num_pid_m, num_pid_n, group_size_m)
    assert sorted(order) == [(i, j) for i in range(num_pid_m) for j in range(num_pid_n)]


@settings(max_examples=30)
@given(st.integers(1, 10), st.integers(1, 10))
def test_group_of_one_row_is_row_major_and_a_full_group_is_column_major(num_pid_m, num_pid_n):
    assert launch_order(num_pid_m, num_pid_n, 1) == [(i, j) for i in range(num_pid_m) for j in range(num_pid_n)]
    assert launch_order(num_pid_m, num_pid_n, num_pid_m) == \
        [(i, j) for j in range(num_pid_n) for i in range(num_pid_m)]


def test_autotuned_matmul_matches_torch_and_names_its_choice():
    from utils.kernels.matmul import AUTOTUNE_CONFIGS, matmul_autotuned, matmul_kernel_autotuned

    device.manual_seed(0)
    a, b = torch.randn(70, 50, device=device.device()), torch.randn(50, 90, device=device.device())
    torch.testing.assert_close(matmul_autotuned(a, b), a @ b, rtol=2e-2 if device.HAS_CUDA else 1e-4,
                               atol=2e-2 if device.HAS_CUDA else 1e-4)
    best = matmul_kernel_autotuned.best_config
    assert any(best.kwargs == c.kwargs and best.num_warps == c.num_warps for c in AUTOTUNE_CONFIGS)
    assert matmul_autotuned(a[:, :0], b[:0]).abs().sum() == 0
    with pytest.raises(ValueError, match="inner dimensions"):
        matmul_autotuned(a, a)


def test_autotune_candidates_fit_in_h100_shared_memory():
    from utils.gpu.hardware import spec
    from utils.kernels.matmul import AUTOTUNE_CONFIGS

    for c in AUTOTUNE_CONFIGS:
        k = c.kwargs
        assert tile_smem_bytes(k["BLOCK_M"], k["BLOCK_N"], k["BLOCK_K"], 2, c.num_stages) <= \
            spec("H100-SXM").smem_per_block_max_bytes, c
