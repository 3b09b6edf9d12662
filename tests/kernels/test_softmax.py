"""utils.kernels.softmax: the fused Triton softmax against torch, its error paths, its memory-traffic count."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from utils.device import INTERPRETER, device, manual_seed
from utils.kernels.softmax import (MAX_N_COLS, UNFUSED_OPS, num_warps_for, softmax, softmax_nbytes,
                                   softmax_unfused)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 1000), (2, 1024), (4, 1537)])
def test_softmax_matches_torch_on_rows_that_are_not_a_power_of_two(shape, dtype):
    manual_seed(0)
    x = (4 * torch.randn(*shape, device=device())).to(dtype)
    y = softmax(x)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y, torch.softmax(x.float(), dim=-1).to(dtype))


def test_softmax_is_safe_where_a_naive_exp_overflows():
    # exp(100) overflows fp16 (max 65504) and exp(1000) overflows fp32; subtracting the row max does not
    for dtype, big in ((torch.float32, 1000.0), (torch.float16, 100.0)):
        x = torch.tensor([[big, big - 1.0, big - 2.0], [0.0, 0.0, big]], device=device(), dtype=dtype)
        assert not torch.isfinite(torch.exp(x)).all()
        y = softmax(x)
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y, torch.softmax(x.float(), dim=-1).to(dtype))


@settings(max_examples=15, deadline=None)
@given(n_rows=st.integers(1, 6), n_cols=st.integers(1, 300), shift=st.floats(-50, 50))
def test_rows_sum_to_one_and_do_not_change_when_shifted(n_rows, n_cols, shift):
    gen = torch.Generator().manual_seed(n_rows * 1000 + n_cols)
    x = torch.randn(n_rows, n_cols, generator=gen).to(device())
    y = softmax(x)
    torch.testing.assert_close(y.sum(dim=-1), torch.ones(n_rows, device=device()))
    torch.testing.assert_close(softmax(x + shift), y, atol=1e-5, rtol=1e-4)


def test_softmax_of_no_rows_is_empty():
    assert softmax(torch.empty(0, 5, device=device())).shape == (0, 5)


def test_unfused_baseline_matches_torch():
    manual_seed(2)
    x = 3 * torch.randn(6, 129, device=device())
    torch.testing.assert_close(softmax_unfused(x), torch.softmax(x, dim=-1))


@pytest.mark.parametrize("make_x, message", [
    (lambda d: torch.ones(2, 3, 4, device=d), "2-D"),
    (lambda d: torch.ones(8, device=d), "2-D"),
    (lambda d: torch.ones(4, 6, device=d).t(), "contiguous"),
    (lambda d: torch.ones(2, 3, device=d, dtype=torch.int32), "floating-point"),
    (lambda d: torch.ones(1, MAX_N_COLS + 1, device=d), "columns"),
    (lambda d: torch.ones(3, 0, device=d), "columns"),
    (lambda d: [[1.0, 2.0]], "torch.Tensor"),
])
def test_softmax_refuses_bad_inputs_with_a_clear_message(make_x, message):
    with pytest.raises(ValueError, match=message):
        softmax(make_x(device()))


@pytest.mark.skipif(not INTERPRETER, reason="bfloat16 is refused only under the interpreter")
def test_softmax_refuses_bfloat16_under_the_interpreter():
    with pytest.raises(ValueError, match="bfloat16"):
        softmax(torch.ones(2, 3, dtype=torch.bfloat16))


def test_traffic_matches_the_triton_tutorial_count():
    # Triton tutorial 02-fused-softmax: naive reads 5MN + 2M and writes 3MN + 2M elements; fused reads MN, writes MN
    m, n = 4096, 1000
    reads = sum(a * m * n + b * m for _, (a, b), _ in UNFUSED_OPS)
    writes = sum(a * m * n + b * m for _, _, (a, b) in UNFUSED_OPS)
    assert (reads, writes) == (5 * m * n + 2 * m, 3 * m * n + 2 * m)
    assert [op for op, _, _ in UNFUSED_OPS] == ["max", "subtract", "exp", "sum", "divide"]
    assert softmax_nbytes(m, n, 4, fused=False) == (8 * m * n + 4 * m) * 4
    assert softmax_nbytes(m, n, 2, fused=True) == 2 * m * n * 2
    # "we can expect a theoretical speed-up of ~4x": (8MN + 4M) / 2MN -> 4 as N grows
    ratio = softmax_nbytes(m, 8192, 4, fused=False) / softmax_nbytes(m, 8192, 4, fused=True)
    assert ratio == pytest.approx(4.0, abs=1e-3)
    with pytest.raises(ValueError, match="element_size"):
        softmax_nbytes(2, 2, 3)
    with pytest.raises(ValueError, match="n_cols"):
        softmax_nbytes(2, -1, 4)


def test_more_warps_for_longer_rows():
    assert [num_warps_for(b) for b in (1, 512, 1024, 2048, 4096, 8192, 16384, 65536)] == [1, 1, 1, 2, 4, 8, 16, 16]
    with pytest.raises(ValueError, match="block_size"):
        num_warps_for(0)


def test_the_unfused_baseline_moves_exactly_what_the_table_says():
    # count the elements each aten op of softmax_unfused reads and writes, on a meta tensor (no compute)
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            numel = lambda tree: sum(t.numel() for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor))  # noqa: E731
            self.ops.append((numel((args, kwargs)), numel(out)))
            return out

    m, n = 96, 1000
    x = torch.empty(m, n, device="meta")
    with Count() as count:
        softmax_unfused(x)
    table = [(r[0] * m * n + r[1] * m, w[0] * m * n + w[1] * m) for _, r, w in UNFUSED_OPS]
    assert count.ops == table


# --- the persistent softmax ---------------------------------------------------------------------------

from utils.gpu.hardware import occupancy_report  # noqa: E402
from utils.kernels.softmax import (INTERPRETER_PROGRAMS, compiled_resources, persistent_programs,  # noqa: E402
                                   softmax_persistent, softmax_persistent_kernel)


@pytest.mark.parametrize("programs", [None, 1, 3, 64])
@pytest.mark.parametrize("shape", [(1, 1), (5, 7), (13, 1000), (9, 1024)])
def test_persistent_softmax_matches_torch_whatever_the_grid(shape, programs):
    """Each program loops over rows p, p + P, ...: every row is written once whatever P is (P > rows too)."""
    manual_seed(0)
    x = 3 * torch.randn(*shape, device=device())
    report: dict = {}
    torch.testing.assert_close(softmax_persistent(x, programs=programs, report=report), torch.softmax(x, dim=-1))
    if programs is not None:
        assert report["programs"] == programs
    elif INTERPRETER:
        assert report["programs"] == min(shape[0], INTERPRETER_PROGRAMS) and report["n_regs"] is None
    else:
        assert report["n_regs"] > 0 and report["programs"] <= shape[0]


def test_persistent_grid_is_the_resident_blocks_of_the_whole_gpu():
    # 16 warps (512 threads) at 32 registers: warps allow 64 / 16 = 4 blocks per SM, registers
    # 65536 / (32 * 32 * 16) = 4: four blocks on each of the H100's 132 SMs
    occ = occupancy_report(512, 32, 0, "H100-SXM")
    assert occ.active_blocks == 4
    assert persistent_programs(100_000, 132, occ.active_blocks) == 528
    assert persistent_programs(300, 132, occ.active_blocks) == 300  # never more programs than rows
    # 8 warps at 128 registers: 65536 / (128 * 32 * 8) = 2 blocks, bound by registers
    occ = occupancy_report(256, 128, 0, "H100-SXM")
    assert (occ.active_blocks, occ.limiter) == (2, "registers")


@pytest.mark.parametrize("call, message", [
    (lambda: persistent_programs(10, 0, 1), "sm_count"),
    (lambda: persistent_programs(10, 132, 0), "blocks_per_sm"),
    (lambda: softmax_persistent(torch.ones(2, 3, device=device()), programs=0), "programs"),
    (lambda: softmax_persistent(torch.ones(2, 3, device=device()), num_stages=0), "num_stages"),
    (lambda: softmax_persistent(torch.ones(4, 6, device=device()).t()), "contiguous"),
])
def test_persistent_softmax_refuses_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.skipif(not INTERPRETER, reason="the interpreter's refusal")
def test_compiled_resources_need_a_compiler():
    x = torch.ones(2, 8)
    with pytest.raises(ValueError, match="interpreter compiles nothing"):
        compiled_resources(softmax_persistent_kernel, x, x, 8, 8, 2, 8, BLOCK_SIZE=8, NUM_STAGES=1)
