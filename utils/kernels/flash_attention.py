"""FlashAttention in Triton: a fused forward and backward that never write the N x N scores to memory.

The algorithm is :mod:`utils.attention.flash_reference` (Dao et al. 2022,
arXiv:2205.14135; the loop order of FlashAttention-2, Dao 2023,
arXiv:2307.08691): one program owns ``BLOCK_M`` query rows of one head and
walks over ``BLOCK_N``-key tiles of K and V, keeping the running maximum
``m_i``, denominator ``l_i`` and unnormalised output ``acc`` in registers. It
writes O and the log-sum-exp ``L`` per row. The exponentials use ``exp2`` with
the scale folded into ``log2(e) * sm_scale``, as Triton's fused-attention
tutorial does (``exp2`` is one instruction on NVIDIA GPUs). A causal program
splits its loop as that tutorial does: the key tiles wholly left of the
diagonal need no mask, only the tiles that cross it are masked, and the grid
starts with the last (heaviest) row tiles. Under grouped-query attention one
program packs the row tiles of the query heads that share a K/V head.

The backward (FlashAttention-2, Algorithm 2) is two kernels: one program per
tile of keys accumulates ``dK`` and ``dV`` over all query tiles, one program
per tile of queries accumulates ``dQ`` over all key tiles. Both recompute
``P = exp(S - L)`` tile by tile from the saved ``L``; ``D = rowsum(dO * O)``
comes from PyTorch first.

On a CPU the kernels run under Triton's interpreter (fp32 and fp16; bf16 is
refused there, see :func:`utils.device.check_dtype`). fp32 inputs are
multiplied in IEEE fp32, not TF32, so results compare with a float64
reference at fp32 tolerances.
"""

from __future__ import annotations

import math

import torch

from utils.kernels.triton_or_stand_in import tl, triton
from utils.attention.flash_reference import check_qkv
from utils.device import check_tensors
from utils.validate import check_positive_int

HEAD_DIMS = (16, 32, 64, 128, 256)
"""Head sizes the kernels take: ``tl.dot`` needs a power of two of at least 16."""
LOG2_E = 1.4426950408889634


@triton.jit
def _attend_tiles(acc, l_i, m_i, q, K, V, k_base, v_base, s_kn, s_vn, rows, dims, n_k, qk_scale, lo, hi,
                  BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    """The online softmax over key tiles ``lo .. hi``; with ``MASK`` each score is checked (tail and causal)."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        if MASK:
            col_ok = cols < n_k
            k_t = tl.load(K + k_base + cols[None, :] * s_kn + dims[:, None], mask=col_ok[None, :], other=0.0)
        else:
            k_t = tl.load(K + k_base + cols[None, :] * s_kn + dims[:, None])
        s = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale
        if MASK:
            keep = col_ok[None, :]
            if CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None])
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASK:
            v = tl.load(V + v_base + cols[:, None] * s_vn + dims[None, :], mask=col_ok[:, None], other=0.0)
        else:
            v = tl.load(V + v_base + cols[:, None] * s_vn + dims[None, :])
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _flash_forward_kernel(Q, K, V, O, LSE, sm_scale,
                          s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ob, s_oh, s_on,
                          n_heads, n_kv_heads, n_q, n_k,
                          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          CAUSAL: tl.constexpr, PRECISION: tl.constexpr, SPLIT: tl.constexpr, GROUP: tl.constexpr):
    """Program (i, b*h_kv) writes O and L for query rows ``i*BLOCK_M ..`` of the GROUP query heads of K/V head h_kv.

    ``GROUP`` query heads share one K/V head (GQA; 1 for multi-head attention): the program stacks their
    ``BLOCK_M``-row tiles into one ``GROUP * BLOCK_M``-row tile, so each K/V tile is loaded once per group.
    ``SPLIT`` (causal only): the key tiles wholly left of the diagonal run without any mask, then the
    tiles that cross it with the mask, and the grid is walked last row tile first (heavy programs first).
    Without it every visited tile is masked score by score, in grid order.
    """
    start_m = tl.program_id(0)
    if CAUSAL and SPLIT:
        start_m = tl.num_programs(0) - 1 - start_m  # the row tiles with the most keys start first
    bh = tl.program_id(1)
    b, h_kv = bh // n_kv_heads, bh % n_kv_heads
    r = tl.arange(0, GROUP * BLOCK_M)
    head = h_kv * GROUP + r // BLOCK_M  # the query head of each stacked row
    rows = start_m * BLOCK_M + r % BLOCK_M
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < n_q
    q = tl.load(Q + b * s_qb + head[:, None] * s_qh + rows[:, None] * s_qn + dims[None, :], mask=row_ok[:, None],
                other=0.0)
    m_i = tl.full([GROUP * BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP * BLOCK_M], tl.float32)
    acc = tl.zeros([GROUP * BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e))
    k_base = b * s_kb + h_kv * s_kh
    v_base = b * s_vb + h_kv * s_vh
    hi = n_k
    if CAUSAL:
        hi = tl.minimum((start_m + 1) * BLOCK_M, n_k)  # tiles right of the diagonal are all masked
        if SPLIT:
            diagonal = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N  # key tiles before this one: every key <= every row
            acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, K, V, k_base, v_base, s_kn, s_vn, rows, dims, n_k,
                                          qk_scale, 0, diagonal, BLOCK_N, False, CAUSAL, PRECISION)
            acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, K, V, k_base, v_base, s_kn, s_vn, rows, dims, n_k,
                                          qk_scale, diagonal, hi, BLOCK_N, True, CAUSAL, PRECISION)
        else:
            acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, K, V, k_base, v_base, s_kn, s_vn, rows, dims, n_k,
                                          qk_scale, 0, hi, BLOCK_N, True, CAUSAL, PRECISION)
    else:
        acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, K, V, k_base, v_base, s_kn, s_vn, rows, dims, n_k,
                                      qk_scale, 0, hi, BLOCK_N, True, CAUSAL, PRECISION)
    acc = acc / l_i[:, None]
    tl.store(O + b * s_ob + head[:, None] * s_oh + rows[:, None] * s_on + dims[None, :], acc.to(O.dtype.element_ty),
             mask=row_ok[:, None])
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # back to natural log: ln(2)
    tl.store(LSE + (b * n_heads + head) * n_q + rows, lse, mask=row_ok)


@triton.jit
def _load_query_tile(Q, DO, LSE, DELTA, q_offsets, stat_offsets, row_ok):
    """A tile of query rows for the backward: Q, dO, the saved log-sum-exp L and D = rowsum(dO * O)."""
    q = tl.load(Q + q_offsets, mask=row_ok[:, None], other=0.0)
    do = tl.load(DO + q_offsets, mask=row_ok[:, None], other=0.0)
    lse = tl.load(LSE + stat_offsets, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + stat_offsets, mask=row_ok, other=0.0)
    return q, do, lse, delta


@triton.jit
def _recompute_p_and_ds(q, k, v, do, lse, delta, rows, cols, row_ok, col_ok, sm_scale,
                        CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    """One tile of the backward: ``P = exp(S - L)`` recomputed, and ``dS = P * (dO V^T - D)``."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * sm_scale
    keep = row_ok[:, None] & col_ok[None, :]
    if CAUSAL:
        keep = keep & (cols[None, :] <= rows[:, None])
    p = tl.where(keep, tl.exp(s - lse[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    return p, p * (dp - delta[:, None])


@triton.jit
def _flash_backward_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale,
                                s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, n_heads, n_q, n_k,
                                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    """Program (j, b*h) writes dK and dV for keys ``j*BLOCK_N ..``: dV = P^T dO, dK = scale dS^T Q."""
    start_n = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // n_heads, bh % n_heads
    cols = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    col_ok = cols < n_k
    kv_offsets = b * s_kb + h * s_kh + cols[:, None] * s_kn + dims[None, :]
    k = tl.load(K + kv_offsets, mask=col_ok[:, None], other=0.0)
    v = tl.load(V + kv_offsets, mask=col_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo = 0
    if CAUSAL:
        lo = (start_n * BLOCK_N) // BLOCK_M * BLOCK_M  # query tiles above the diagonal see none of these keys
    for start_m in range(lo, n_q, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        row_ok = rows < n_q
        q_offsets = b * s_qb + h * s_qh + rows[:, None] * s_qn + dims[None, :]
        q, do, lse, delta = _load_query_tile(Q, DO, LSE, DELTA, q_offsets, bh * n_q + rows, row_ok)
        p, ds = _recompute_p_and_ds(q, k, v, do, lse, delta, rows, cols, row_ok, col_ok, sm_scale, CAUSAL, PRECISION)
        dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PRECISION)
        dk += tl.dot(tl.trans(ds).to(q.dtype), q, input_precision=PRECISION)
    tl.store(DK + kv_offsets, (dk * sm_scale).to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + kv_offsets, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def _flash_backward_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, sm_scale,
                              s_qb, s_qh, s_qn, s_kb, s_kh, s_kn, n_heads, n_q, n_k,
                              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    """Program (i, b*h) writes dQ for query rows ``i*BLOCK_M ..``: dQ = scale dS K."""
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // n_heads, bh % n_heads
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    row_ok = rows < n_q
    q_offsets = b * s_qb + h * s_qh + rows[:, None] * s_qn + dims[None, :]
    q, do, lse, delta = _load_query_tile(Q, DO, LSE, DELTA, q_offsets, bh * n_q + rows, row_ok)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = n_k
    if CAUSAL:
        hi = tl.minimum((start_m + 1) * BLOCK_M, n_k)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < n_k
        kv_offsets = b * s_kb + h * s_kh + cols[:, None] * s_kn + dims[None, :]
        k = tl.load(K + kv_offsets, mask=col_ok[:, None], other=0.0)
        v = tl.load(V + kv_offsets, mask=col_ok[:, None], other=0.0)
        _, ds = _recompute_p_and_ds(q, k, v, do, lse, delta, rows, cols, row_ok, col_ok, sm_scale, CAUSAL, PRECISION)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + q_offsets, (dq * sm_scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


def _blocks(n_q: int, n_k: int, block_m: int | None, block_n: int | None) -> tuple[int, int]:
    """Tile sides: powers of two >= 16, 64 by default, no larger than the padded sequence."""
    def pick(value: int | None, n: int, name: str) -> int:
        if value is None:
            return max(16, min(64, triton.next_power_of_2(n)))
        check_positive_int(name, value)
        if value < 16 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot's smallest tile), got {value}")
        return value
    return pick(block_m, n_q, "block_m"), pick(block_n, n_k, "block_n")


def _prepare(q, k, v, causal, sm_scale):
    check_qkv(q, k, v, causal, gqa=True)
    group = q.shape[1] // k.shape[1]
    if group & (group - 1):
        raise ValueError(f"q's heads over k's heads must be a power of two (the packed tile is a power of two), "
                         f"got {q.shape[1]} / {k.shape[1]} = {group}; expand k and v with repeat_interleave first")
    check_tensors(q, k, v)
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {q.shape[-1]}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    return q, k, v, scale, precision


class FlashAttention(torch.autograd.Function):
    """Triton forward saving O and the log-sum-exp; Triton backward recomputing P tile by tile."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, block_m, block_n, split_diagonal=True):
        q, k, v, scale, precision = _prepare(q, k, v, causal, sm_scale)
        batch, heads, n_q, d = q.shape
        kv_heads, n_k = k.shape[1], k.shape[2]
        group = heads // kv_heads
        bm, bn = _blocks(n_q, n_k, block_m, block_n)
        if block_m is None and group > 1:
            bm = max(16, bm // group)  # keep the stacked tile, group * bm rows, near the default's size
        out = torch.empty_like(q)
        lse = torch.empty((batch * heads, n_q), dtype=torch.float32, device=q.device)
        grid = (triton.cdiv(n_q, bm), batch * kv_heads)
        _flash_forward_kernel[grid](q, k, v, out, lse, scale,
                                    *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
                                    heads, kv_heads, n_q, n_k, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal,
                                    PRECISION=precision, SPLIT=bool(split_diagonal), GROUP=group)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (causal, scale, bm, bn, precision)
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        causal, scale, bm, bn, precision = ctx.args
        batch, heads, n_q, d = q.shape
        kv_heads, n_k = k.shape[1], k.shape[2]
        group = heads // kv_heads
        if group > 1:  # GQA: the backward runs per query head on expanded K/V, then sums each group's dK, dV
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        d_out = d_out.contiguous() if d_out.stride() != q.stride() else d_out
        if k.stride() != v.stride():
            v = v.contiguous()
            k = k.contiguous()
        delta = (d_out.float() * out.float()).sum(-1).reshape(batch * heads, n_q)  # D = rowsum(dO * O)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        strides = (*q.stride()[:3], *k.stride()[:3], heads, n_q, n_k)
        meta = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, PRECISION=precision)
        _flash_backward_dkdv_kernel[(triton.cdiv(n_k, bn), batch * heads)](
            q, k, v, d_out, lse, delta, dk, dv, scale, *strides, **meta)
        _flash_backward_dq_kernel[(triton.cdiv(n_q, bm), batch * heads)](
            q, k, v, d_out, lse, delta, dq, scale, *strides, **meta)
        if group > 1:
            dk, dv = (t.view(batch, kv_heads, group, n_k, d).sum(2) for t in (dk, dv))
        return dq, dk, dv, None, None, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    sm_scale: float | None = None, block_m: int | None = None, block_n: int | None = None,
                    split_diagonal: bool = True) -> torch.Tensor:
    """``softmax(Q K^T * sm_scale) V`` by the Triton kernels, differentiable.

    ``q`` is ``(batch, heads, n_q, head_dim)``, ``k`` and ``v`` are
    ``(batch, kv_heads, n_k, head_dim)``, all of one dtype on
    :func:`utils.device.device`; ``head_dim`` is one of :data:`HEAD_DIMS`;
    sequence lengths need not be multiples of the tiles. ``causal`` masks key
    ``j > i`` for query ``i`` and needs ``n_q == n_k``. ``sm_scale`` defaults to
    ``1 / sqrt(head_dim)``. ``kv_heads`` is ``heads`` (multi-head attention) or
    ``heads / g`` for grouped-query attention with ``g`` a power of two: query
    head ``h`` reads K/V head ``h // g``, and one program packs the same row
    tile of a group's ``g`` heads, so each K/V tile is loaded once per group
    (:func:`utils.attention.flash_schedule.gqa_kv_tile_loads`); ``block_m`` is
    then per head (``64 / g`` by default). ``block_m`` and ``block_n`` are the query and key
    tile sides (powers of two >= 16; 64, or less for short sequences, by default).
    ``split_diagonal`` (causal only): run the key tiles left of the diagonal
    without a mask and only the diagonal tiles masked, heavy row tiles first,
    as Triton's fused-attention tutorial does; ``False`` masks every visited
    tile (the same result; :func:`utils.attention.flash_schedule.causal_tile_counts`
    counts what the split saves).
    """
    if not isinstance(split_diagonal, bool):
        raise ValueError(f"split_diagonal must be True or False, got {split_diagonal!r}")
    return FlashAttention.apply(q, k, v, causal, sm_scale, block_m, block_n, split_diagonal)
