"""A fast FlashAttention-2 backward in Triton: one fused launch writes dQ, dK and dV.

The algorithm is FlashAttention-2's backward (Dao 2023, arXiv:2307.08691,
Algorithm 2). From the forward's output ``O`` and log-sum-exp ``L`` it
recomputes each tile of probabilities ``P = exp(S - L)`` and applies

    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D),  dK = scale dS^T Q,  dQ = scale dS K

with ``D = rowsum(dO * O)``. The loop structure follows Triton's fused-attention
tutorial (``python/tutorials/06-fused-attention.py``); the simple two-kernel
version of the same maths is :mod:`utils.kernels.flash_attention`. What makes
this one fast:

- **One fused launch** (after a small preprocessing one). Program ``j`` of
  head ``b*h`` first owns the keys ``j*BLOCK_N1 ..``: K and V stay in
  registers while it walks query tiles of ``BLOCK_M1`` rows, accumulating dV
  and dK. It then owns the query rows ``j*BLOCK_M2 ..``: Q and dO stay
  resident while it walks key tiles of ``BLOCK_N2``, accumulating dQ. Every
  output is written once, without the atomic adds of the paper's dQ; the
  price is recomputing S and dP for dQ (7 matmuls per pair of tiles where
  Algorithm 2 has 5).
- **Base 2.** The resident K (or Q) tile is pre-scaled by
  ``scale * log2(e)`` and ``L`` converted to ``L2 = L * log2(e)``, so a
  probability is one subtraction and one ``exp2`` (one instruction on NVIDIA
  GPUs): ``P = exp2(Q (K scale log2 e)^T - L2)``.
- **No masks off the diagonal.** With ``causal``, each walk is split into the
  diagonal tiles, masked and cut into slices of ``BLOCK // BLK_SLICE_FACTOR``
  so that little work is masked away, and the fully visible tiles, which run
  with no mask at all; fully masked tiles are never visited. Without
  ``causal`` no tile is masked.
- **No bounds checks.** ``N`` must be a multiple of 128 and of every tile, so
  loads and stores carry no masks.

A small preprocessing kernel computes ``D`` and ``L2`` first. On a CPU the
kernels run under Triton's interpreter (fp32 and fp16; bf16 is refused there,
see :func:`utils.device.check_dtype`), where ``num_warps`` and ``num_stages``
are ignored.
"""

from __future__ import annotations

import torch

from utils.kernels.triton_or_stand_in import tl, triton
from utils.device import INTERPRETER, check_tensors
from utils.validate import check_positive, check_positive_int

HEAD_DIMS = (16, 32, 64, 128)
"""Head sizes the fused backward takes (K, V, dK and dV of a tile must fit in registers)."""
SEQ_MULTIPLE = 128
"""The sequence length must be a multiple of this (and of every tile side): no bounds masks."""
DTYPES = (torch.float32, torch.float16) if INTERPRETER else (torch.float16, torch.bfloat16)
"""Input dtypes taken here: fp16/bf16 on a GPU, fp32/fp16 under the interpreter."""
BACKWARD_CONFIGS = (
    (64, 128, 128, 64, 8, 3),  # the default: the fastest of the sweep on an H100, causal or not (about 1.4x FA-2)
    (32, 128, 128, 32, 4, 5),  # Triton's tutorial's tiles (tuned there for d = 64): 0.36x FA-2 at d = 128
    (32, 128, 128, 32, 8, 3),  # d = 128: 8 warps halve each thread's share of the fp32 dK, dV
    (64, 128, 128, 64, 8, 2),
    (32, 64, 64, 32, 4, 3),
    (64, 64, 64, 64, 4, 3),
)
"""``(block_m1, block_n1, block_m2, block_n2, num_warps, num_stages)`` swept on an H100 by
``python -m benchmarks.hopper_kernels --sweep`` (``benchmarks/results/hopper_sweep-h100-sxm.txt``, 2026-11-26:
b4 h16 n4096 d128 fp16). With the tutorial's 4 warps the two 128 x 128 fp32 accumulators of dK and dV need
256 registers a thread on their own, so the compiler spills; 8 warps and 64-row query tiles ran fastest."""


def backward_flops(batch: int, heads: int, n: int, head_dim: int, causal: bool) -> float:
    """Matmul FLOPs of the attention backward: ``10 b h n^2 d``, half that when ``causal``.

    Five ``n x n x d`` matmuls of ``2 n^2 d`` FLOPs each (recomputing S, dP = dO V^T,
    dV = P^T dO, dK = dS^T Q, dQ = dS K): FlashAttention-2, Dao 2023,
    arXiv:2307.08691, Algorithm 2; the paper's benchmarks (section 4.1) count the
    backward as 2.5 times the forward's ``4 n^2 d`` per head, the same figure. This is
    the conventional count for FLOP/s; the fused kernel here executes ``14 b h n^2 d``
    (it recomputes S and dP for dQ).
    """
    for name, value in (("batch", batch), ("heads", heads), ("n", n), ("head_dim", head_dim)):
        check_positive_int(name, value)
    flops = 10.0 * batch * heads * n * n * head_dim
    return flops / 2 if causal else flops


@triton.jit
def _preprocess_kernel(O, DO, LSE, DELTA, LSE2, n_ctx, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """Program (i, b*h): ``D = rowsum(dO * O)`` and ``L2 = L * log2(e)`` for rows ``i*BLOCK_M ..``."""
    bh = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offsets = bh * n_ctx * HEAD_DIM + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    o = tl.load(O + offsets).to(tl.float32)
    do = tl.load(DO + offsets).to(tl.float32)
    stats = bh * n_ctx + rows
    tl.store(DELTA + stats, tl.sum(o * do, axis=1))
    tl.store(LSE2 + stats, tl.load(LSE + stats) * 1.4426950408889634)


@triton.jit
def _dkdv_steps(dk, dv, k, v, Q, DO, LSE2, DELTA, start_n, start_m, num_steps,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                MASK: tl.constexpr, PRECISION: tl.constexpr):
    """Walk ``num_steps`` query tiles from ``start_m``, adding ``P^T dO`` to dV and ``dS^T Q`` to dK.

    Works on transposed tiles (keys x queries), so P^T and dS^T never need a transpose.
    ``k`` is pre-scaled by ``scale * log2(e)``; ``LSE2`` and ``DELTA`` start at this head.
    """
    rows = start_m + tl.arange(0, BLOCK_M)
    cols = start_n + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    q_t_ptrs = Q + rows[None, :] * HEAD_DIM + dims[:, None]
    do_ptrs = DO + rows[:, None] * HEAD_DIM + dims[None, :]
    for _ in range(num_steps):
        q_t = tl.load(q_t_ptrs)
        lse2 = tl.load(LSE2 + rows)  # issued before the matmul, to hide its latency
        p_t = tl.math.exp2(tl.dot(k, q_t, input_precision=PRECISION) - lse2[None, :])
        if MASK:
            p_t = tl.where(rows[None, :] >= cols[:, None], p_t, 0.0)  # query i sees keys j <= i
        do = tl.load(do_ptrs)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=PRECISION)
        delta = tl.load(DELTA + rows)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), input_precision=PRECISION)
        rows += BLOCK_M
        q_t_ptrs += BLOCK_M * HEAD_DIM
        do_ptrs += BLOCK_M * HEAD_DIM
    return dk, dv


@triton.jit
def _dq_steps(dq, q, do, lse2, delta, K, V, start_m, start_n, num_steps,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              MASK: tl.constexpr, PRECISION: tl.constexpr):
    """Walk ``num_steps`` key tiles from ``start_n``, adding ``dS K`` to dQ.

    ``q`` is pre-scaled by ``scale * log2(e)``; ``K`` and ``V`` start at this head.
    """
    rows = start_m + tl.arange(0, BLOCK_M)
    cols = start_n + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    k_t_ptrs = K + cols[None, :] * HEAD_DIM + dims[:, None]
    v_t_ptrs = V + cols[None, :] * HEAD_DIM + dims[:, None]
    for _ in range(num_steps):
        k_t = tl.load(k_t_ptrs)
        v_t = tl.load(v_t_ptrs)
        p = tl.math.exp2(tl.dot(q, k_t, input_precision=PRECISION) - lse2[:, None])
        if MASK:
            p = tl.where(rows[:, None] >= cols[None, :], p, 0.0)
        dp = tl.dot(do, v_t, input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k_t.dtype), tl.trans(k_t), input_precision=PRECISION)
        cols += BLOCK_N
        k_t_ptrs += BLOCK_N * HEAD_DIM
        v_t_ptrs += BLOCK_N * HEAD_DIM
    return dq


@triton.jit
def _flash_backward_kernel(Q, K, V, DO, DQ, DK, DV, LSE2, DELTA, sm_scale, n_ctx,
                           HEAD_DIM: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                           BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, BLK_SLICE_FACTOR: tl.constexpr,
                           CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    """Program (j, b*h): dK, dV for keys ``j*BLOCK_N1 ..``, then dQ for queries ``j*BLOCK_M2 ..``."""
    tl.static_assert(BLOCK_N1 % BLOCK_M1 == 0)
    tl.static_assert(BLOCK_M2 % BLOCK_N2 == 0)
    SLICE_M1: tl.constexpr = BLOCK_M1 // BLK_SLICE_FACTOR  # query rows per diagonal step of dK, dV
    SLICE_N2: tl.constexpr = BLOCK_N2 // BLK_SLICE_FACTOR  # key rows per diagonal step of dQ
    qk_scale = sm_scale * 1.4426950408889634  # scale * log2(e): exp(scale s) = exp2(qk_scale s)
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)  # int64: batch * heads * N * d may exceed 2**31
    head = bh * n_ctx * HEAD_DIM
    Q, K, V, DO = Q + head, K + head, V + head, DO + head
    DQ, DK, DV = DQ + head, DK + head, DV + head
    LSE2, DELTA = LSE2 + bh * n_ctx, DELTA + bh * n_ctx
    dims = tl.arange(0, HEAD_DIM)

    # Part 1: dK and dV of keys start_n .. start_n + BLOCK_N1; K and V stay in registers.
    start_n = pid * BLOCK_N1
    kv_offsets = (start_n + tl.arange(0, BLOCK_N1))[:, None] * HEAD_DIM + dims[None, :]
    k = tl.load(K + kv_offsets)
    k = (k * qk_scale).to(k.dtype)  # so that k q^T is the score in base 2
    v = tl.load(V + kv_offsets)
    dk = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N1, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:  # queries above start_n see none of these keys: skipped; the diagonal in slices
        dk, dv = _dkdv_steps(dk, dv, k, v, Q, DO, LSE2, DELTA, start_n, start_n, BLOCK_N1 // SLICE_M1,
                             HEAD_DIM, SLICE_M1, BLOCK_N1, True, PRECISION)
        start_m = start_n + BLOCK_N1
    else:
        start_m = 0
    dk, dv = _dkdv_steps(dk, dv, k, v, Q, DO, LSE2, DELTA, start_n, start_m, (n_ctx - start_m) // BLOCK_M1,
                         HEAD_DIM, BLOCK_M1, BLOCK_N1, False, PRECISION)
    tl.store(DV + kv_offsets, dv.to(DV.dtype.element_ty))
    # dS came from natural-log P, so dK = scale dS^T Q: no ln 2 to undo (Q was not scaled here).
    tl.store(DK + kv_offsets, (dk * sm_scale).to(DK.dtype.element_ty))

    # Part 2: dQ of queries start_m .. start_m + BLOCK_M2; Q, dO, L2, D stay in registers.
    start_m = pid * BLOCK_M2
    rows = start_m + tl.arange(0, BLOCK_M2)
    q_offsets = rows[:, None] * HEAD_DIM + dims[None, :]
    q = tl.load(Q + q_offsets)
    q = (q * qk_scale).to(q.dtype)
    do = tl.load(DO + q_offsets)
    lse2 = tl.load(LSE2 + rows)
    delta = tl.load(DELTA + rows)
    dq = tl.zeros([BLOCK_M2, HEAD_DIM], dtype=tl.float32)
    if CAUSAL:  # keys right of the diagonal skipped; the diagonal in slices, then keys 0 .. start_m
        dq = _dq_steps(dq, q, do, lse2, delta, K, V, start_m, start_m, BLOCK_M2 // SLICE_N2,
                       HEAD_DIM, BLOCK_M2, SLICE_N2, True, PRECISION)
        end_n = start_m
    else:
        end_n = n_ctx
    dq = _dq_steps(dq, q, do, lse2, delta, K, V, start_m, 0, end_n // BLOCK_N2,
                   HEAD_DIM, BLOCK_M2, BLOCK_N2, False, PRECISION)
    # dQ = scale dS K, and K was not scaled here (Q was): no ln 2 to undo either.
    tl.store(DQ + q_offsets, (dq * sm_scale).to(DQ.dtype.element_ty))


def _check_blocks(n: int, causal: bool, block_m1: int, block_n1: int, block_m2: int, block_n2: int,
                  blk_slice_factor: int) -> None:
    named = dict(block_m1=block_m1, block_n1=block_n1, block_m2=block_m2, block_n2=block_n2)
    for name, value in named.items():
        check_positive_int(name, value)
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot's smallest tile), got {value}")
        if n % value:
            raise ValueError(f"the sequence length {n} must be a multiple of {name} = {value}")
    check_positive_int("blk_slice_factor", blk_slice_factor)
    if block_n1 != block_m2:
        raise ValueError(f"block_n1 and block_m2 must be equal (one grid serves both parts), "
                         f"got {block_n1} and {block_m2}")
    if block_n1 % block_m1 or block_m2 % block_n2:
        raise ValueError(f"block_m1 must divide block_n1 and block_n2 must divide block_m2, got "
                         f"block_m1={block_m1}, block_n1={block_n1}, block_m2={block_m2}, block_n2={block_n2}")
    for name, value in (("block_m1", block_m1), ("block_n2", block_n2)):
        if causal and (value % blk_slice_factor or value // blk_slice_factor < 16):
            raise ValueError(f"{name} // blk_slice_factor must be a whole tile of >= 16 rows, "
                             f"got {name}={value}, blk_slice_factor={blk_slice_factor}")


def _check_inputs(q, k, v, out, lse, d_out, causal, sm_scale) -> None:
    named = dict(q=q, k=k, v=v, out=out, d_out=d_out, lse=lse)
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_tensors(*named.values())
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    check_positive("sm_scale", sm_scale, finite=True)
    if q.dim() != 4:
        raise ValueError(f"q must be 4-D (batch, heads, N, head_dim), got shape {tuple(q.shape)}")
    for name in ("k", "v", "out", "d_out"):
        t = named[name]
        if t.shape != q.shape or t.dtype != q.dtype:
            raise ValueError(f"{name} must match q's shape {tuple(q.shape)} and dtype {q.dtype} "
                             f"(n_q == n_k), got {tuple(t.shape)} and {t.dtype}")
    if q.dtype not in DTYPES:
        raise ValueError(f"dtype {q.dtype} is not supported here; use one of {DTYPES}")
    batch, heads, n, head_dim = q.shape
    if min(batch, heads) < 1 or n % SEQ_MULTIPLE or n == 0:
        raise ValueError(f"the sequence length must be a positive multiple of {SEQ_MULTIPLE} "
                         f"(batch and heads >= 1), got shape {tuple(q.shape)}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}")
    if lse.dtype != torch.float32 or lse.shape != (batch * heads, n):
        raise ValueError(f"lse must be float32 of shape (batch * heads, N) = {(batch * heads, n)}, "
                         f"got {lse.dtype} of shape {tuple(lse.shape)}")
    for name, t in named.items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous; call .contiguous() first")


def flash_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                             lse: torch.Tensor, d_out: torch.Tensor, causal: bool, sm_scale: float, *,
                             block_m1: int = 64, block_n1: int = 128, block_m2: int = 128, block_n2: int = 64,
                             blk_slice_factor: int = 2, num_warps: int = 8, num_stages: int = 3
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dQ, dK, dV)`` of ``O = softmax(Q K^T * sm_scale [+ causal mask]) V`` given ``dO``.

    ``q``, ``k``, ``v``, ``out`` and ``d_out`` are contiguous ``(batch, heads, N, head_dim)``
    tensors of one dtype (:data:`DTYPES`), ``N`` a multiple of 128 (queries and keys alike),
    ``head_dim`` in :data:`HEAD_DIMS`. ``lse`` is float32 ``(batch * heads, N)``: the
    natural-log log-sum-exp of each query row's scaled (and masked) scores, as
    :class:`utils.kernels.flash_attention.FlashAttention` saves it. Tiles: the key-side
    ``block_n1`` (= the query-side ``block_m2``) is walked against query tiles of ``block_m1``
    and key tiles of ``block_n2``; diagonal tiles are cut into ``blk_slice_factor`` slices.
    ``num_warps`` and ``num_stages`` are Triton launch options (ignored by the interpreter).
    """
    _check_inputs(q, k, v, out, lse, d_out, causal, sm_scale)
    batch, heads, n, head_dim = q.shape
    _check_blocks(n, causal, block_m1, block_n1, block_m2, block_n2, blk_slice_factor)
    launch = dict(num_warps=check_positive_int("num_warps", num_warps),  # the interpreter ignores these
                  num_stages=check_positive_int("num_stages", num_stages))
    delta = torch.empty_like(lse)  # D = rowsum(dO * O), by the preprocessing kernel
    lse2 = torch.empty_like(lse)  # L * log2(e)
    _preprocess_kernel[(n // SEQ_MULTIPLE, batch * heads)](out, d_out, lse, delta, lse2, n,
                                                             HEAD_DIM=head_dim, BLOCK_M=SEQ_MULTIPLE)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _flash_backward_kernel[(n // block_n1, batch * heads)](
        q, k, v, d_out, dq, dk, dv, lse2, delta, float(sm_scale), n,
        HEAD_DIM=head_dim, BLOCK_M1=block_m1, BLOCK_N1=block_n1, BLOCK_M2=block_m2, BLOCK_N2=block_n2,
        BLK_SLICE_FACTOR=blk_slice_factor, CAUSAL=causal,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", **launch)
    return dq, dk, dv
