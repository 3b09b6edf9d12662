"""Tiled matmul in Triton, ``C = A @ B``: the reference solution of lab 3 (``labs/01-gpu-architecture/03-tiled-matmul``).

Each *program* computes one ``BLOCK_M x BLOCK_N`` tile of ``C``. It walks the
shared dimension in steps of ``BLOCK_K``: at each step it loads a
``BLOCK_M x BLOCK_K`` block of ``A`` and a ``BLOCK_K x BLOCK_N`` block of ``B``
into on-chip memory and multiplies them on the Tensor Cores with ``tl.dot``,
adding into an fp32 accumulator. Programs are numbered in *grouped* order
(``group_size_m`` rows of tiles at a time, column by column inside a group),
so that programs running at the same time share blocks of ``A`` and ``B`` in
the L2 cache. The structure follows Triton's tutorial ``03-matrix-multiplication.py``
(triton-lang/triton, ``python/tutorials``), which introduced the grouped order.

Besides the kernel and its launcher :func:`matmul`, this module has the small
calculators the lab plots and checks: :func:`tile_intensity`,
:func:`tile_smem_bytes`, :func:`tile_order`, :func:`blocks_loaded` and
:func:`working_set_bytes`.
"""

from __future__ import annotations

import torch

from utils.kernels.triton_or_stand_in import tl, triton
from utils.device import INTERPRETER, check_tensors
from utils.validate import check_element_size, check_nonnegative_int, check_positive_int

# Defaults for fp16 on an H100: the first configuration of the autotuning list in Triton's matmul
# tutorial (128 x 256 x 64 tiles, groups of 8 rows of tiles, 8 warps, 3 pipeline stages). Its operand
# buffers take (128*64 + 64*256) * 2 bytes * 3 stages = 144 KiB of the 227 KiB of shared memory a
# block may use on H100 (see tile_smem_bytes).
DEFAULT_BLOCK_M = 128
DEFAULT_BLOCK_N = 256
DEFAULT_BLOCK_K = 64
DEFAULT_GROUP_SIZE_M = 8
DEFAULT_NUM_WARPS = 8
DEFAULT_NUM_STAGES = 3

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_NUM_WARPS_ALLOWED = (1, 2, 4, 8, 16, 32)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_SIZE_M: tl.constexpr):
    """Program ``pid`` writes one ``BLOCK_M x BLOCK_N`` tile of ``C = A @ B``; tiles are taken in grouped order."""
    # 1. Which tile? Grouped order: GROUP_SIZE_M rows of tiles at a time, walked column by column.
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_group = GROUP_SIZE_M * num_pid_n
    first_row = (pid // tiles_per_group) * GROUP_SIZE_M
    rows_in_group = min(num_pid_m - first_row, GROUP_SIZE_M)  # the last group may be shorter
    pid_m = first_row + (pid % tiles_per_group) % rows_in_group
    pid_n = (pid % tiles_per_group) // rows_in_group

    # 2. Pointers to the first K-block of A (BLOCK_M x BLOCK_K) and of B (BLOCK_K x BLOCK_N).
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn

    # 3. Walk K: load both blocks (masked at the edges, zeros outside), multiply-accumulate in fp32.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # 4. Write the tile in C's dtype, masking rows and columns past the edge.
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_block(name: str, value: object) -> None:
    if not _is_int(value) or value < 16 or value & (value - 1):
        raise ValueError(f"{name} must be a power of two >= 16 (tl.arange needs a power of two and "
                         f"tl.dot needs every side >= 16), got {value!r}")


def _check_operands(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"a and b must be 2-D matrices, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)} and b is {tuple(b.shape)}; "
                         "a @ b needs a.shape[1] == b.shape[0]")
    if a.dtype != b.dtype:
        raise ValueError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {a.dtype} is not supported; use one of "
                         f"{', '.join(str(d) for d in SUPPORTED_DTYPES)}")


def matmul(a: torch.Tensor, b: torch.Tensor, block_m: int = DEFAULT_BLOCK_M, block_n: int = DEFAULT_BLOCK_N,
           block_k: int = DEFAULT_BLOCK_K, group_size_m: int = DEFAULT_GROUP_SIZE_M,
           num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """``a @ b`` computed by :func:`matmul_kernel`, as a new ``(M, N)`` tensor in the inputs' dtype.

    ``a`` is ``(M, K)`` and ``b`` is ``(K, N)``, both 2-D, of the same dtype
    (float16, bfloat16 on a GPU only, or float32), on :func:`utils.device.device`;
    any strides work (``b`` may be a transposed view). The product is
    accumulated in fp32 and rounded once to the output dtype. On a GPU,
    ``tl.dot`` multiplies fp32 inputs in TF32 (10-bit mantissa), like
    ``torch.backends.cuda.matmul.allow_tf32 = True``; compare with a TF32-sized tolerance.

    ``block_m``, ``block_n``, ``block_k`` are the tile sides (powers of two
    >= 16); ``group_size_m`` the rows of tiles per group of the launch order
    (1 is row-major); ``num_warps`` (default 8) and ``num_stages`` (default 3,
    the depth of the software pipeline of K-blocks) tune the compiled kernel
    and are ignored by the interpreter. The grid has
    ``ceil(M / block_m) * ceil(N / block_n)`` programs.
    """
    check_tensors(a, b)
    _check_operands(a, b)
    for name, value in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        _check_block(name, value)
    check_positive_int("group_size_m", group_size_m)
    num_warps = DEFAULT_NUM_WARPS if num_warps is None else num_warps
    num_stages = DEFAULT_NUM_STAGES if num_stages is None else num_stages
    if num_warps not in _NUM_WARPS_ALLOWED or isinstance(num_warps, bool):
        raise ValueError(f"num_warps must be one of {_NUM_WARPS_ALLOWED}, got {num_warps!r}")
    check_positive_int("num_stages", num_stages)

    (m, k), n = a.shape, b.shape[1]
    if m == 0 or n == 0 or k == 0:  # nothing to launch; an empty sum is 0
        return torch.zeros((m, n), dtype=a.dtype, device=a.device)
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    matmul_kernel[grid](a, b, c, m, n, k,
                        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_SIZE_M=group_size_m,
                        num_warps=num_warps, num_stages=num_stages)
    return c


def _config(bm: int, bn: int, bk: int, stages: int, warps: int) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_SIZE_M": 8},
                         num_stages=stages, num_warps=warps)


AUTOTUNE_CONFIGS: tuple[triton.Config, ...] = (
    # The eight fp16 configurations of Triton's matmul tutorial (get_cuda_autotune_config, 03-matrix-multiplication.py)...
    _config(128, 256, 64, 3, 8), _config(64, 256, 32, 4, 4), _config(128, 128, 32, 4, 4), _config(128, 64, 32, 4, 4),
    _config(64, 128, 32, 4, 4), _config(128, 32, 32, 4, 4), _config(64, 32, 32, 5, 2), _config(32, 64, 32, 5, 2),
    # ...and two with deeper K-blocks that Hopper's 227 KiB of shared memory can hold.
    _config(128, 256, 64, 4, 8), _config(256, 128, 64, 3, 8),
)
"""Candidates :func:`matmul_autotuned` times on the first call for each (M, N, K). The interpreter gets only
the first: it would otherwise run every candidate in NumPy, and its timings mean nothing anyway."""

matmul_kernel_autotuned = triton.autotune(
    configs=list(AUTOTUNE_CONFIGS[:1] if INTERPRETER else AUTOTUNE_CONFIGS), key=["M", "N", "K"])(matmul_kernel)
""":func:`matmul_kernel` behind ``@triton.autotune``: on the first launch for a new ``(M, N, K)`` it compiles
and times every configuration (``triton.testing.do_bench``), keeps the fastest in ``.best_config``, and
launches that one from then on."""


def matmul_autotuned(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` like :func:`matmul`, with tiles, warps and stages chosen by :data:`matmul_kernel_autotuned`.

    The first call for a shape is slow (it compiles and times every candidate of :data:`AUTOTUNE_CONFIGS`);
    ``matmul_kernel_autotuned.best_config`` then names the winner.
    """
    check_tensors(a, b)
    _check_operands(a, b)
    (m, k), n = a.shape, b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return torch.zeros((m, n), dtype=a.dtype, device=a.device)
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)

    def grid(meta: dict) -> tuple[int]:
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    matmul_kernel_autotuned[grid](a, b, c, m, n, k,
                                  a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    return c


def tile_intensity(block_m: int, block_n: int, block_k: int, element_size: int) -> float:
    """FLOPs per byte loaded of one K-step of one output tile.

    One step multiplies a ``block_m x block_k`` block of A by a
    ``block_k x block_n`` block of B: ``2 * block_m * block_n * block_k`` FLOPs
    (a multiply and an add per term) for ``(block_m + block_n) * block_k``
    loaded elements, so

        intensity = 2 * BM * BN * BK / ((BM * BK + BK * BN) * element_size)
                  = 2 * BM * BN / ((BM + BN) * element_size),

    independent of ``block_k``: 64 FLOPs/byte for a 128 x 128 fp16 tile.
    (Roofline model: Williams, Waterman and Patterson, CACM 2009.)
    """
    for name, value in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k)):
        check_positive_int(name, value)
    check_element_size(element_size)
    return 2 * block_m * block_n * block_k / ((block_m * block_k + block_k * block_n) * element_size)


def tile_smem_bytes(block_m: int, block_n: int, block_k: int, element_size: int, num_stages: int = 1) -> int:
    """Bytes of on-chip memory for the operand blocks: ``(BM * BK + BK * BN) * element_size * num_stages``.

    A software pipeline of ``num_stages`` keeps that many K-blocks of A and B
    in flight at once. The compiled kernel needs somewhat more (the epilogue,
    barriers), so treat this as a lower bound to compare with the shared memory
    a block may use (227 KiB on H100: CUDA C++ Programming Guide, compute capability 9.0).
    """
    for name, value in (("block_m", block_m), ("block_n", block_n), ("block_k", block_k),
                        ("num_stages", num_stages)):
        check_positive_int(name, value)
    check_element_size(element_size)
    return (block_m * block_k + block_k * block_n) * element_size * num_stages


def tile_order(pid: int, num_pid_m: int, num_pid_n: int, group_size_m: int) -> tuple[int, int]:
    """The tile ``(pid_m, pid_n)`` of C that program ``pid`` computes in grouped order.

    The same arithmetic as :func:`matmul_kernel`: programs come in groups of
    ``group_size_m * num_pid_n``; group ``g`` covers tile rows
    ``g * group_size_m`` to ``g * group_size_m + rows - 1`` (``rows`` is
    ``group_size_m`` except for a shorter last group) and walks them column by
    column. ``group_size_m = 1`` is row-major order; ``group_size_m >= num_pid_m``
    is column-major order.
    """
    check_positive_int("num_pid_m", num_pid_m)
    check_positive_int("num_pid_n", num_pid_n)
    check_positive_int("group_size_m", group_size_m)
    if not _is_int(pid) or not 0 <= pid < num_pid_m * num_pid_n:
        raise ValueError(f"pid must be an int in 0..{num_pid_m * num_pid_n - 1}, got {pid!r}")
    tiles_per_group = group_size_m * num_pid_n
    first_row = (pid // tiles_per_group) * group_size_m
    rows_in_group = min(num_pid_m - first_row, group_size_m)
    return first_row + (pid % tiles_per_group) % rows_in_group, (pid % tiles_per_group) // rows_in_group


def launch_order(num_pid_m: int, num_pid_n: int, group_size_m: int) -> list[tuple[int, int]]:
    """All tiles ``(pid_m, pid_n)`` in the order programs 0, 1, 2, ... compute them (see :func:`tile_order`)."""
    check_positive_int("num_pid_m", num_pid_m)
    check_positive_int("num_pid_n", num_pid_n)
    return [tile_order(pid, num_pid_m, num_pid_n, group_size_m) for pid in range(num_pid_m * num_pid_n)]


def blocks_loaded(num_pid_m: int, num_pid_n: int, num_pid_k: int, group_size_m: int, n_programs: int) -> int:
    """Distinct blocks of A and B that the first ``n_programs`` programs read, in grouped order.

    Output tile ``(i, j)`` needs row panel ``i`` of A and column panel ``j`` of
    B, each ``num_pid_k`` blocks long, so the count is
    ``(distinct rows + distinct columns) * num_pid_k``. Programs that run at
    the same time and read the same blocks can share them through the L2 cache.
    Triton's matmul tutorial (section "L2 Cache Optimizations") counts, for
    9 x 9 blocks, 90 blocks for the first 9 tiles in row-major order and 54 in
    grouped order with groups of 3 rows.
    """
    check_positive_int("num_pid_k", num_pid_k)
    check_positive_int("num_pid_m", num_pid_m)
    check_positive_int("num_pid_n", num_pid_n)
    rows, cols = _distinct_panels(n_programs, num_pid_m, num_pid_n, group_size_m)
    return (rows + cols) * num_pid_k


def working_set_bytes(m: int, n: int, k: int, block_m: int, block_n: int, group_size_m: int, n_programs: int,
                      element_size: int) -> int:
    """Bytes of A and B that the first ``n_programs`` programs of an ``m x k @ k x n`` matmul read.

    Program ``pid`` reads row panel ``pid_m`` of A (``block_m x k``) and column
    panel ``pid_n`` of B (``k x block_n``), with ``(pid_m, pid_n)`` from
    :func:`tile_order`. If the programs running at the same time (a *wave*:
    about one or two per SM) read less than the L2 cache holds, each panel
    comes from HBM once and is then shared through L2:

        bytes = (distinct rows * block_m + distinct columns * block_n) * k * element_size.

    Edge panels are counted at full size (an upper bound when ``block_m`` or
    ``block_n`` does not divide the matrix).
    """
    for name, value in (("m", m), ("n", n), ("k", k), ("block_m", block_m), ("block_n", block_n)):
        check_positive_int(name, value)
    check_element_size(element_size)
    num_pid_m, num_pid_n = triton.cdiv(m, block_m), triton.cdiv(n, block_n)
    rows, cols = _distinct_panels(n_programs, num_pid_m, num_pid_n, group_size_m)
    return (rows * block_m + cols * block_n) * k * element_size


def _distinct_panels(n_programs: int, num_pid_m: int, num_pid_n: int, group_size_m: int) -> tuple[int, int]:
    """How many distinct row panels of A and column panels of B the first ``n_programs`` programs read."""
    check_nonnegative_int("n_programs", n_programs)
    if n_programs > num_pid_m * num_pid_n:
        raise ValueError(f"n_programs must be at most the {num_pid_m * num_pid_n} tiles of the grid, got {n_programs}")
    tiles = [tile_order(pid, num_pid_m, num_pid_n, group_size_m) for pid in range(n_programs)]
    return len({i for i, _ in tiles}), len({j for _, j in tiles})
