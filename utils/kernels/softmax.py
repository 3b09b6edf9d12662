"""Row-wise softmax in Triton, fused into one kernel: the reference solution of lab 2
(``labs/01-gpu-architecture/02-fused-softmax``).

The *safe* softmax of a row ``x`` subtracts the row maximum before
exponentiating, which leaves the result unchanged and keeps ``exp`` from
overflowing:

    softmax(x)_j = exp(x_j - max_k x_k) / sum_i exp(x_i - max_k x_k)

Written as separate PyTorch ops (:func:`softmax_unfused`: max, subtract, exp,
sum, divide) each op reads its input from memory and writes its output back.
The fused kernel :func:`softmax_kernel` loads a whole row once into registers,
does all five steps there, and writes the result once: ``M N`` elements read
and ``M N`` written, against ``5 M N + 2 M`` read and ``3 M N + 2 M`` written
unfused (Triton tutorial ``02-fused-softmax.py``, triton-lang/triton,
``python/tutorials``). :func:`softmax_nbytes` counts both.

One program handles one row, with ``BLOCK_SIZE = next_power_of_2(n_cols)``
lanes; lanes past the row's end load ``-inf``, so they add ``exp(-inf) = 0``
to the sum and never win the max.
"""

from __future__ import annotations

import torch

from utils.kernels.triton_or_stand_in import tl, triton
from utils.device import INTERPRETER, check_tensors
from utils.validate import check_element_size, check_nonnegative_int, check_positive_int

MAX_N_COLS = 2**16
"""Longest row :func:`softmax` accepts. The whole row lives in registers: compiled for sm_90a
(H100) with 16 warps, ptxas reports no register spills up to 2**15 fp32 columns and a few hundred
bytes of spills at 2**16; longer rows would spill more and more. Longer rows need an online
softmax over tiles (the attention chapter)."""

UNFUSED_OPS: tuple[tuple[str, tuple[int, int], tuple[int, int]], ...] = (
    # op, elements read as (a, b) meaning a*M*N + b*M, elements written likewise
    ("max", (1, 0), (0, 1)),        # read x, write the row maxima m
    ("subtract", (1, 1), (1, 0)),   # read x and m, write z = x - m
    ("exp", (1, 0), (1, 0)),        # read z, write e = exp(z)
    ("sum", (1, 0), (0, 1)),        # read e, write the row sums s
    ("divide", (1, 1), (1, 0)),     # read e and s, write y = e / s
)
"""Memory traffic of :func:`softmax_unfused`, op by op, in elements of an M x N input.
Summed: ``5 M N + 2 M`` read, ``3 M N + 2 M`` written (Triton tutorial ``02-fused-softmax.py``)."""


def num_warps_for(block_size: int) -> int:
    """Warps per program for a row of ``block_size`` lanes: one warp per 1024 lanes, from 1 to 16.

    That keeps about 32 values per thread whatever the row length. Measured on an H100 SXM
    (4096 fp32 rows, 2026-11-23), it was the fastest or within 2% of the fastest of 1 to 32 warps
    for every width from 1024 to 16384; at 2048 columns it reached 2,548 GB/s against 2,378 with
    the 8 warps of the older rule (4 below 2048 lanes, 8 below 4096, 16 above, from early versions
    of Triton's fused-softmax tutorial). The interpreter ignores it.
    """
    check_positive_int("block_size", block_size)
    return min(16, max(1, block_size // 1024))


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    """Program ``row`` writes the safe softmax of input row ``row``, computed in fp32, in one pass."""
    row = tl.program_id(axis=0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    z = x - tl.max(x, axis=0)
    numerator = tl.exp(z)
    denominator = tl.sum(numerator, axis=0)
    y = numerator / denominator
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _check_matrix(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x is a {type(x).__name__}, expected a torch.Tensor")
    if x.dim() != 2:
        raise ValueError(f"softmax takes a 2-D tensor (rows x columns), got {x.dim()}-D shape {tuple(x.shape)}; "
                         "reshape it to (-1, n_cols) first")
    if not x.is_floating_point():
        raise ValueError(f"softmax needs a floating-point tensor, got {x.dtype}")


def _check_rows(x: torch.Tensor) -> tuple[int, int]:
    """``(n_rows, n_cols)`` of a contiguous 2-D float tensor whose rows fit in one program, or a ValueError."""
    check_tensors(x)
    _check_matrix(x)
    if not x.is_contiguous():
        raise ValueError("x must be contiguous (one program reads one row of consecutive elements); "
                         "call .contiguous() first")
    n_rows, n_cols = x.shape
    if not 1 <= n_cols <= MAX_N_COLS:
        raise ValueError(f"rows must have 1 to {MAX_N_COLS} columns to fit in one program, got {n_cols}")
    return n_rows, n_cols


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax of each row of a 2-D tensor (along ``dim=-1``) by :func:`softmax_kernel`, as a new tensor.

    ``x`` must be a contiguous 2-D floating-point tensor on :func:`utils.device.device`
    with ``1 <= n_cols <=`` :data:`MAX_N_COLS`. Computes in fp32, returns ``x.dtype``.
    """
    n_rows, n_cols = _check_rows(x)
    y = torch.empty_like(x)
    if n_rows == 0:
        return y
    block_size = triton.next_power_of_2(n_cols)
    softmax_kernel[(n_rows,)](y, x, x.stride(0), y.stride(0), n_cols,
                              BLOCK_SIZE=block_size, num_warps=num_warps_for(block_size))
    return y


def softmax_unfused(x: torch.Tensor) -> torch.Tensor:
    """Safe softmax along ``dim=-1`` as five separate PyTorch ops (max, subtract, exp, sum, divide).

    Each op is its own kernel and its own trip through memory: the baseline
    whose traffic :data:`UNFUSED_OPS` counts. Computes in ``x.dtype``, on any device
    (``meta`` tensors included, so its traffic can be counted without computing).
    """
    _check_matrix(x)
    row_max = x.amax(dim=1, keepdim=True)  # amax, not max: max(dim) also writes int64 indices
    z = x - row_max
    numerator = torch.exp(z)
    denominator = numerator.sum(dim=1, keepdim=True)
    return numerator / denominator


def softmax_nbytes(n_rows: int, n_cols: int, element_size: int, fused: bool = True) -> int:
    """Bytes a row-wise softmax of an ``n_rows x n_cols`` matrix moves to and from memory.

    Fused: read once, write once, ``2 M N`` elements. Unfused (:data:`UNFUSED_OPS`):
    ``(5 M N + 2 M) + (3 M N + 2 M) = 8 M N + 4 M`` elements. Times ``element_size`` bytes.
    """
    check_nonnegative_int("n_rows", n_rows)
    check_nonnegative_int("n_cols", n_cols)
    check_element_size(element_size)
    m, n = n_rows, n_cols
    if fused:
        elements = 2 * m * n
    else:
        elements = sum(a * m * n + b * m for _, read, write in UNFUSED_OPS for a, b in (read, write))
    return elements * element_size


# --- A persistent softmax: a grid sized from the compiled kernel's registers and shared memory ---------------

INTERPRETER_PROGRAMS = 4
"""Programs :func:`softmax_persistent` launches under Triton's interpreter, which compiles nothing and so
has no register or shared-memory count to size a grid from; four are enough to exercise the row loop."""


@triton.jit
def softmax_persistent_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_rows, n_cols,
                              BLOCK_SIZE: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Program ``p`` of ``P`` writes rows ``p, p + P, p + 2P, ...``: the grid is as large as the GPU holds at
    once, and each program loops over rows instead of ending after one (``tl.range`` software-pipelines the
    loop, so the next row's load is issued while this one is computed)."""
    first = tl.program_id(axis=0)
    step = tl.num_programs(axis=0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    for row in tl.range(first, n_rows, step, num_stages=NUM_STAGES):
        x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
        z = x - tl.max(x, axis=0)
        numerator = tl.exp(z)
        y = numerator / tl.sum(numerator, axis=0)
        tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def persistent_programs(n_rows: int, sm_count: int, blocks_per_sm: int) -> int:
    """Programs of a persistent launch: one per block the GPU keeps resident, ``sm_count * blocks_per_sm``,
    and never more than there are rows (Triton tutorial ``02-fused-softmax.py``: ``num_programs =
    min(NUM_SM * occupancy, n_rows)``). ``blocks_per_sm`` comes from :func:`utils.gpu.hardware.occupancy_report`
    with the compiled kernel's registers per thread and shared memory per block."""
    check_nonnegative_int("n_rows", n_rows)
    check_positive_int("sm_count", sm_count)
    check_positive_int("blocks_per_sm", blocks_per_sm)
    return min(n_rows, sm_count * blocks_per_sm)


def compiled_resources(kernel, *args, grid: tuple[int, ...] = (1,), **meta) -> tuple[int, int]:
    """``(registers per thread, shared memory bytes per block)`` of ``kernel`` compiled for these arguments.

    ``JITFunction.warmup`` compiles without launching; the compiled kernel's ``n_regs`` is what ptxas
    allocated and ``metadata.shared`` what the kernel asks for at launch (both are also in the cubin that
    ``cuobjdump --dump-resource-usage`` reads). Needs a GPU: the interpreter compiles nothing.
    """
    if INTERPRETER:
        raise ValueError("Triton's interpreter compiles nothing, so there are no registers to count; "
                         "run on a GPU, or pass the grid yourself")
    compiled = kernel.warmup(*args, grid=grid, **meta)
    compiled._init_handles()  # loads the cubin, which fills in n_regs
    return int(compiled.n_regs), int(compiled.metadata.shared)


def softmax_persistent(x: torch.Tensor, num_stages: int = 2, programs: int | None = None,
                       report: dict | None = None) -> torch.Tensor:
    """Softmax of each row of a 2-D tensor by :func:`softmax_persistent_kernel`, on a persistent grid.

    The grid is :func:`persistent_programs` with ``blocks_per_sm`` from the occupancy calculator
    (:func:`utils.gpu.hardware.occupancy_report`) fed with the compiled kernel's registers and shared
    memory (:func:`compiled_resources`): as many programs as the SMs hold at once, each looping over rows.
    ``programs`` overrides the grid (required in effect under the interpreter, which uses
    :data:`INTERPRETER_PROGRAMS`). If ``report`` is a dict, it receives ``programs``, ``n_regs``,
    ``shared_bytes``, ``blocks_per_sm`` and ``limiter``. Same inputs and output as :func:`softmax`.
    """
    n_rows, n_cols = _check_rows(x)
    check_positive_int("num_stages", num_stages)
    y = torch.empty_like(x)
    if n_rows == 0:
        return y
    block_size = triton.next_power_of_2(n_cols)
    num_warps = num_warps_for(block_size)
    args = (y, x, x.stride(0), y.stride(0), n_rows, n_cols)
    meta = dict(BLOCK_SIZE=block_size, NUM_STAGES=num_stages, num_warps=num_warps)
    info: dict = {"n_regs": None, "shared_bytes": None, "blocks_per_sm": None, "limiter": None}
    if programs is not None:
        check_positive_int("programs", programs)
    elif INTERPRETER:
        programs = min(n_rows, INTERPRETER_PROGRAMS)
    else:
        from utils.gpu.hardware import occupancy_report, spec_for_device

        n_regs, shared = compiled_resources(softmax_persistent_kernel, *args, **meta)
        props = torch.cuda.get_device_properties(x.device)
        chip = spec_for_device(props.name)
        if chip is not None:
            occ = occupancy_report(32 * num_warps, n_regs, shared, chip.name)
            blocks, limiter = occ.active_blocks, occ.limiter
        else:  # a GPU the calculator does not know: the tutorial's two limits, from the driver's properties
            by_regs = props.regs_per_multiprocessor // (n_regs * 32 * num_warps)
            by_smem = props.shared_memory_per_multiprocessor // shared if shared else by_regs
            blocks, limiter = max(1, min(by_regs, by_smem)), "registers" if by_regs <= by_smem else "shared memory"
        programs = persistent_programs(n_rows, props.multi_processor_count, blocks)
        info.update(n_regs=n_regs, shared_bytes=shared, blocks_per_sm=blocks, limiter=limiter)
    info["programs"] = programs
    if report is not None:
        report.update(info)
    softmax_persistent_kernel[(programs,)](*args, **meta)
    return y
