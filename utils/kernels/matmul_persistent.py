"""A persistent matmul with TMA tensor descriptors, in fp16/bf16 and in fp8 (e4m3): Hopper's way to feed Tensor Cores.

The tiled matmul of lab 3 (:mod:`utils.kernels.matmul`) launches one program per
output tile and computes every load address itself. This kernel changes two
things, both of which Hopper (compute capability 9.0) supports in hardware:

1. **Persistent programs.** The grid has one program per SM (132 on an H100
   SXM), and program ``p`` computes tiles ``p, p + P, p + 2P, ...`` of C in
   grouped order (the order of lab 3, so tiles computed at the same time share
   panels of A and B in L2). Launch and tail costs are paid once per SM rather
   than once per tile, and the next tile's loads can start while the last
   tile's result is still being written (``tl.range(..., flatten=True)`` lets
   the compiler pipeline across the tile boundary).
2. **TMA tensor descriptors.** ``tl.make_tensor_descriptor(ptr, shape, strides,
   block_shape)`` describes a 2-D tensor to the Tensor Memory Accelerator, the
   copy engine next to each SM's shared memory. ``desc.load([row, col])`` then
   issues one bulk copy of a whole ``block_shape`` tile from HBM into shared
   memory: no per-thread address arithmetic, no masks (the hardware fills
   out-of-bounds elements with zeros and clips stores at the edges), and the
   copy runs asynchronously while the warps do math. Descriptors made inside
   the kernel live in a small global scratch buffer, so the launcher installs
   an allocator with ``triton.set_allocator``. The design follows Triton's
   tutorial ``09-persistent-matmul.py`` (triton-lang/triton, ``python/tutorials``).

The fp8 variant multiplies ``float8_e4m3fn`` operands on Hopper's fp8 Tensor
Cores (twice the fp16 rate: 1,979 TFLOP/s dense on an H100 SXM, NVIDIA's
datasheet) and applies per-tensor scales in the epilogue, computing
``(a @ b) * scale_a * scale_b`` like ``torch._scaled_mm``. Hopper's fp8
``wgmma`` needs B K-major, so ``b`` is passed as the transpose of a contiguous
``(N, K)`` matrix, as ``torch._scaled_mm`` requires too.

Under Triton's CPU interpreter the fp16/fp32 kernel runs (tensor descriptors
are emulated); fp8 runs on a GPU only.
"""

from __future__ import annotations

import torch

from utils.kernels.triton_or_stand_in import tl, triton
from utils.device import INTERPRETER, check_tensors
from utils.kernels.matmul import _check_block

TMA_ALIGNMENT_BYTES = 16
"""TMA needs every row stride and the base address to be multiples of 16 bytes (CUDA driver API,
``cuTensorMapEncodeTiled``)."""

DEFAULT_CONFIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_SIZE_M=8, EPILOGUE_SUBTILE=False,
                      num_warps=8, num_stages=3)
"""fp16/bf16 tiles for an H100: 128 x 256 x 64, as the fastest configuration of lab 3's sweep. In the sweep
recorded on an H100 it ran at 733 TFLOP/s against cuBLAS's 761; the sub-tiled epilogue with 4 stages at 739,
within the run-to-run spread."""
DEFAULT_FP8_CONFIG = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_SIZE_M=8, EPILOGUE_SUBTILE=True,
                          num_warps=8, num_stages=4)
"""fp8 tiles: K-blocks of 128 one-byte elements fill the same 128-byte rows as 64 fp16 elements. The epilogue
stores the tile in two halves (less shared memory for it, room for a fourth pipeline stage). In the sweep
recorded on an H100 (``benchmarks/results/hopper_sweep-h100-sxm.txt``) the sub-tiled epilogue ran at 1,310
TFLOP/s with 3 stages and 1,326 with 4; the one-store epilogue with 3 stages at 766 there and at 1,184 in the
harness run of the same session."""

SWEEP_CONFIGS: tuple[dict, ...] = tuple(
    dict(BLOCK_M=128, BLOCK_N=bn, BLOCK_K=bk, GROUP_SIZE_M=8, EPILOGUE_SUBTILE=sub, num_warps=w, num_stages=s)
    for bn, bk, s in ((256, 64, 3), (256, 64, 4), (128, 64, 4), (128, 128, 3), (256, 128, 2))
    for w in (8,) for sub in (False, True))
"""Candidates ``benchmarks.hopper_kernels`` times on a GPU (fp16: K-block in elements; fp8 doubles it)."""


@triton.jit
def _grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    """The tile ``(pid_m, pid_n)`` of C numbered ``tile_id`` in grouped order (lab 3's ``tile_order``)."""
    tiles_per_group = GROUP_SIZE_M * num_pid_n
    first_row = (tile_id // tiles_per_group) * GROUP_SIZE_M
    rows_in_group = min(num_pid_m - first_row, GROUP_SIZE_M)
    return first_row + (tile_id % tiles_per_group) % rows_in_group, (tile_id % tiles_per_group) // rows_in_group


@triton.jit
def matmul_persistent_kernel(a_ptr, b_ptr, c_ptr, scale_ptr, M, N, K, NUM_PROGRAMS,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             GROUP_SIZE_M: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
                             B_K_MAJOR: tl.constexpr, SCALED: tl.constexpr):
    """Program ``p`` computes tiles ``p, p + NUM_PROGRAMS, ...`` of ``C = A @ B`` (times ``*scale_ptr`` if SCALED).

    A is ``(M, K)`` row-major. B is ``(K, N)`` row-major, or with ``B_K_MAJOR`` the ``(N, K)`` row-major
    matrix whose transpose is B. Every load and store is a TMA copy of one block.
    """
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    if B_K_MAJOR:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BLOCK_K, BLOCK_N])
    STORE_N: tl.constexpr = BLOCK_N // 2 if EPILOGUE_SUBTILE else BLOCK_N
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, STORE_N])

    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    # The epilogue recomputes its tile from a counter of its own, so that the flattened loop does not
    # carry one value from the first K-step to the store (the tutorial's workaround for the pipeliner).
    tile_id_c = tl.program_id(0) - NUM_PROGRAMS
    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = _grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            if B_K_MAJOR:
                b = b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K]).T
            else:
                b = b_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
            acc = tl.dot(a, b, acc)
        tile_id_c += NUM_PROGRAMS
        pid_m, pid_n = _grouped_tile(tile_id_c, num_pid_m, num_pid_n, GROUP_SIZE_M)
        if SCALED:
            acc = acc * tl.load(scale_ptr)
        if EPILOGUE_SUBTILE:  # two half-width stores: less shared memory for the epilogue, more for the pipeline
            acc0, acc1 = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc0.to(c_ptr.dtype.element_ty))
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N + BLOCK_N // 2], acc1.to(c_ptr.dtype.element_ty))
        else:
            c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global memory for the descriptors ``tl.make_tensor_descriptor`` writes (one 128-byte TMA map each)."""
    return torch.empty(size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() else "cpu")


def num_programs(m: int, n: int, block_m: int, block_n: int) -> int:
    """Persistent grid size: one program per SM, or one per tile when there are fewer tiles than SMs."""
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    if INTERPRETER or not torch.cuda.is_available():
        return min(tiles, 4)  # the interpreter runs programs one after another: a few exercise the tile loop
    return min(tiles, torch.cuda.get_device_properties(0).multi_processor_count)


def _check_tma_layout(name: str, t: torch.Tensor) -> None:
    if t.data_ptr() % TMA_ALIGNMENT_BYTES or (t.shape[1] * t.element_size()) % TMA_ALIGNMENT_BYTES:
        raise ValueError(f"{name} must start at a 16-byte-aligned address and have rows that are a multiple of "
                         f"16 bytes for TMA, got shape {tuple(t.shape)} of {t.dtype} "
                         f"({t.shape[1] * t.element_size()} bytes per row)")


def _launch(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, scale: torch.Tensor | None,
            config: dict | None, default: dict) -> torch.Tensor:
    cfg = dict(default if config is None else config)
    for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        _check_block(key.lower(), cfg[key])
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"a must be (M, K) and b (K, N), got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    (m, k), n = a.shape, b.shape[1]
    a = a.contiguous()
    b_k_major = b.stride(0) == 1 and b.stride(1) == k and b.shape[1] > 1
    b_store = b.T if b_k_major else b.contiguous()  # the (N, K) or (K, N) row-major matrix in memory
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_()
    for name, t in (("a", a), ("b", b_store), ("c", c)):
        _check_tma_layout(name, t)
    triton.set_allocator(_scratch)
    grid = (num_programs(m, n, cfg["BLOCK_M"], cfg["BLOCK_N"]),)
    matmul_persistent_kernel[grid](
        a, b_store, c, scale if scale is not None else a, m, n, k, grid[0],
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_SIZE_M=cfg["GROUP_SIZE_M"],
        EPILOGUE_SUBTILE=cfg["EPILOGUE_SUBTILE"], B_K_MAJOR=b_k_major, SCALED=scale is not None,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return c


def matmul_persistent(a: torch.Tensor, b: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """``a @ b`` by :func:`matmul_persistent_kernel`: one program per SM, TMA loads and stores.

    ``a`` is ``(M, K)`` and ``b`` is ``(K, N)``, both float16 or bfloat16 (float32 in the interpreter
    only: on a GPU ``tl.dot`` would round it to TF32) on :func:`utils.device.device`; ``b`` may be
    row-major or the transpose of a row-major ``(N, K)`` matrix (then it is read K-major, no copy).
    Rows must be multiples of 16 bytes (K and N multiples of 8 in fp16). Accumulates in fp32 and rounds
    once to the inputs' dtype. ``config`` overrides :data:`DEFAULT_CONFIG` (tiles, group, warps, stages).
    """
    check_tensors(a, b)
    allowed = (torch.float16, torch.bfloat16) + ((torch.float32,) if INTERPRETER else ())
    if a.dtype != b.dtype or a.dtype not in allowed:
        raise ValueError(f"a and b must share one dtype of {', '.join(map(str, allowed))}, got {a.dtype} and {b.dtype}")
    return _launch(a, b, a.dtype, None, config, DEFAULT_CONFIG)


def matmul_fp8(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
               out_dtype: torch.dtype = torch.bfloat16, config: dict | None = None) -> torch.Tensor:
    """``(a @ b) * scale_a * scale_b`` on the fp8 Tensor Cores, the contract of ``torch._scaled_mm``.

    ``a`` is ``(M, K)`` row-major and ``b`` is ``(K, N)`` column-major (``b = w.T`` for a row-major
    ``(N, K)`` ``w``), both ``torch.float8_e4m3fn`` on a CUDA GPU of compute capability 9.0 or newer;
    ``scale_a`` and ``scale_b`` are one-element float32 tensors (per-tensor scaling: the fp8 values times
    their scale are the real numbers). The product is accumulated by the Tensor Cores and rounded once to
    ``out_dtype`` (bfloat16, float16 or float32).
    """
    if not (torch.cuda.is_available() and not INTERPRETER):
        raise ValueError("matmul_fp8 needs a CUDA GPU with fp8 Tensor Cores (Hopper or newer); "
                         "Triton's CPU interpreter has no fp8")
    check_tensors(a, b)
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise ValueError(f"a and b must be torch.float8_e4m3fn, got {a.dtype} and {b.dtype}")
    if not (b.dim() == 2 and b.stride(0) == 1 and b.stride(1) == b.shape[0]):
        raise ValueError("b must be column-major (the transpose of a contiguous (N, K) matrix), as Hopper's fp8 "
                         f"Tensor Cores read B K-major; got strides {tuple(b.stride())} for shape {tuple(b.shape)}")
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"out_dtype must be torch.bfloat16, torch.float16 or torch.float32, got {out_dtype}")
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if s.numel() != 1 or s.dtype != torch.float32:
            raise ValueError(f"{name} must be a one-element float32 tensor (per-tensor scale), got {s.dtype} "
                             f"of shape {tuple(s.shape)}")
    scale = (scale_a * scale_b).reshape(1).to(a.device)
    return _launch(a, b, out_dtype, scale, config, DEFAULT_FP8_CONFIG)
