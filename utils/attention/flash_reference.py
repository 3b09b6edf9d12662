"""FlashAttention's algorithm in plain PyTorch: online softmax, tiled forward, recomputing backward.

Standard attention ``O = softmax(Q K^T * scale) V`` writes the ``N x N``
scores ``S`` and probabilities ``P`` to memory and reads them back.
FlashAttention (Dao et al. 2022, arXiv:2205.14135, Algorithms 1 and 2) never
materialises them: it walks over tiles of K and V, keeping for each query row a
running maximum ``m``, a running denominator ``l`` and an unnormalised output:

    m_new = max(m, rowmax(S_tile))
    l_new = exp(m - m_new) l + rowsum(exp(S_tile - m_new))
    O_new = exp(m - m_new) O + exp(S_tile - m_new) V_tile

and divides by ``l`` at the end (the FlashAttention-2 form, Dao 2023,
arXiv:2307.08691, section 3.1). It saves only ``O`` and the log-sum-exp
``L = m + log l`` per row. The backward recomputes each tile of ``P`` as
``exp(S_tile - L)`` and uses ``D = rowsum(dO * O)``:

    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D),  dQ = dS K * scale,  dK = dS^T Q * scale

The same algorithm in Triton is :mod:`utils.kernels.flash_attention`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from utils.validate import check_positive_int


class OnlineSoftmaxState(NamedTuple):
    """After a block: running max ``m``, running denominator ``l``, and the softmax so far ``exp(x - m) / l``."""

    m: float
    l: float
    probabilities: list[float]


def online_softmax_steps(blocks: list[list[float]]) -> list[OnlineSoftmaxState]:
    """The state of an online softmax after each block of ``blocks`` (one row, seen block by block).

    Milakov & Gimelshein 2018, arXiv:1805.02867: the entries seen so far are
    rescaled by ``exp(m_old - m_new)`` whenever the maximum grows. For
    ``[[1, 2], [3, 4]]`` the last state equals ``softmax([1, 2, 3, 4])``.
    """
    if not blocks or any(len(b) == 0 for b in blocks):
        raise ValueError("blocks must be a non-empty list of non-empty lists of numbers")
    m, l, seen, states = -math.inf, 0.0, [], []
    for block in blocks:
        m_new = max(m, max(block))
        l = l * math.exp(m - m_new) + sum(math.exp(x - m_new) for x in block)
        m = m_new
        seen += list(block)
        states.append(OnlineSoftmaxState(m, l, [math.exp(x - m) / l for x in seen]))
    return states


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, gqa: bool = False) -> None:
    """``ValueError`` unless q, k, v are ``(batch, heads, seq, head_dim)`` with matching sizes and dtype.

    With ``gqa``, k and v may have fewer heads than q, a divisor of q's (grouped-query attention).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (batch, heads, seq, head_dim), "
                             f"got {getattr(t, 'shape', type(t).__name__)}")
    heads_ok = q.shape[1] == k.shape[1] or (gqa and k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0)
    if k.shape != v.shape or q.shape[0] != k.shape[0] or not heads_ok or q.shape[3] != k.shape[3]:
        raise ValueError(f"q, k, v shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; "
                         "k and v must be equal and share batch, heads and head_dim with q"
                         + (" (or have a divisor of q's heads)" if gqa else ""))
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(f"causal attention needs as many queries as keys, got {q.shape[2]} and {k.shape[2]}")
    if min(q.shape) == 0 or k.shape[2] == 0:
        raise ValueError(f"every size must be >= 1, got q {tuple(q.shape)} and k {tuple(k.shape)}")


def _scale(sm_scale: float | None, head_dim: int) -> float:
    return 1 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                        sm_scale: float | None = None) -> torch.Tensor:
    """Standard attention, ``softmax(Q K^T * scale + mask) V``, materialising S and P."""
    check_qkv(q, k, v, causal)
    scores = (q @ k.transpose(-2, -1)) * _scale(sm_scale, q.shape[-1])
    if causal:
        n = q.shape[2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def _causal_tile_mask(rows: range, cols: range, device: torch.device) -> torch.Tensor:
    r = torch.arange(rows.start, rows.stop, device=device)[:, None]
    c = torch.arange(cols.start, cols.stop, device=device)[None, :]
    return c > r


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for 16- and 32-bit inputs (as the kernels accumulate), fp64 for fp64 inputs."""
    return torch.promote_types(dtype, torch.float32)


class TiledAttention(torch.autograd.Function):
    """Attention computed tile by tile; forward saves O and the log-sum-exp, backward recomputes P."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, sm_scale: float, block_q: int, block_k: int):
        n_q, n_k = q.shape[2], k.shape[2]
        acc_dtype = accumulation_dtype(q.dtype)
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], dtype=acc_dtype, device=q.device)
        for i in range(0, n_q, block_q):
            rows = range(i, min(i + block_q, n_q))
            qi = q[:, :, i:rows.stop].to(acc_dtype)
            m = torch.full(qi.shape[:3], -math.inf, dtype=acc_dtype, device=q.device)
            l = torch.zeros_like(m)
            acc = torch.zeros_like(qi)
            for j in range(0, rows.stop if causal else n_k, block_k):
                cols = range(j, min(j + block_k, n_k))
                s = qi @ k[:, :, j:cols.stop].to(acc_dtype).transpose(-2, -1) * sm_scale
                if causal:
                    s = s.masked_fill(_causal_tile_mask(rows, cols, q.device), -math.inf)
                m_new = torch.maximum(m, s.amax(-1))
                p = torch.exp(s - m_new[..., None])
                alpha = torch.exp(m - m_new)
                l = alpha * l + p.sum(-1)
                acc = alpha[..., None] * acc + p @ v[:, :, j:cols.stop].to(acc_dtype)
                m = m_new
            out[:, :, i:rows.stop] = (acc / l[..., None]).to(q.dtype)
            lse[:, :, i:rows.stop] = m + torch.log(l)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (causal, sm_scale, block_q, block_k)
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        causal, sm_scale, block_q, block_k = ctx.args
        n_q, n_k = q.shape[2], k.shape[2]
        acc_dtype = accumulation_dtype(q.dtype)
        dq, dk, dv = (torch.zeros_like(t, dtype=acc_dtype) for t in (q, k, v))
        delta = (d_out.to(acc_dtype) * out.to(acc_dtype)).sum(-1)  # D = rowsum(dO * O)
        for i in range(0, n_q, block_q):
            rows = range(i, min(i + block_q, n_q))
            qi, doi = q[:, :, i:rows.stop].to(acc_dtype), d_out[:, :, i:rows.stop].to(acc_dtype)
            for j in range(0, rows.stop if causal else n_k, block_k):
                cols = range(j, min(j + block_k, n_k))
                kj, vj = k[:, :, j:cols.stop].to(acc_dtype), v[:, :, j:cols.stop].to(acc_dtype)
                s = qi @ kj.transpose(-2, -1) * sm_scale
                if causal:
                    s = s.masked_fill(_causal_tile_mask(rows, cols, q.device), -math.inf)
                p = torch.exp(s - lse[:, :, i:rows.stop, None])  # P recomputed from the saved log-sum-exp
                dv[:, :, j:cols.stop] += p.transpose(-2, -1) @ doi
                dp = doi @ vj.transpose(-2, -1)
                ds = p * (dp - delta[:, :, i:rows.stop, None])
                dq[:, :, i:rows.stop] += ds @ kj * sm_scale
                dk[:, :, j:cols.stop] += ds.transpose(-2, -1) @ qi * sm_scale
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    sm_scale: float | None = None, block_q: int = 64, block_k: int = 64) -> torch.Tensor:
    """Attention by :class:`TiledAttention` (differentiable), for q, k, v of shape ``(batch, heads, seq, head_dim)``."""
    check_qkv(q, k, v, causal)
    check_positive_int("block_q", block_q)
    check_positive_int("block_k", block_k)
    return TiledAttention.apply(q, k, v, causal, _scale(sm_scale, q.shape[-1]), block_q, block_k)


KV_REUSE = ("none", "l2")
"""Where FlashAttention's re-reads of K and V are served: ``"none"`` from HBM every time, ``"l2"`` from the L2 cache."""


def attention_hbm_bytes(seq_len: int, head_dim: int, element_size: int = 2, block_rows: int = 128,
                        kv_reuse: str = "none") -> tuple[float, float]:
    """HBM bytes of one head's forward: (standard, FlashAttention), counted as in Dao et al. 2022, section 3.2.

    Standard attention (their Algorithm 0) reads Q and K (``2Nd``) and writes
    S (``N^2``), reads S and writes P (``2N^2``), reads P and V and writes O
    (``N^2 + 2Nd``): ``4Nd + 4N^2`` elements. FlashAttention in the order of
    FlashAttention-2 and of this module (an outer loop over ``T_r = ceil(N /
    B_r)`` tiles of ``B_r = block_rows`` query rows) reads Q once, K and V once
    per row tile and writes O once: ``2Nd + 2 T_r N d`` elements, plus ``N``
    fp32 log-sum-exps. That is ``Theta(N^2 d / B_r)``; since a tile must fit
    in SRAM of ``M`` elements, ``B_r`` is at most about ``M / 4d``, which gives
    the paper's ``Theta(N^2 d^2 / M)`` (Theorem 2).

    ``kv_reuse`` says where the re-reads come from. ``"none"`` (the default,
    the paper's count, one level of SRAM under HBM): every row tile's K/V reads
    reach HBM. ``"l2"``: the row tiles of a head run at about the same time, so
    after the first program has pulled a K/V tile into the L2 cache the others
    find it there, and HBM sees K and V once: ``4Nd`` elements plus the
    log-sum-exps. That holds while the K/V of the heads in flight fit in L2
    (:func:`kv_working_set_bytes`); the re-reads then still cross the L2-to-SM
    path (:func:`kv_l2_to_sm_bytes`).
    """
    n = check_positive_int("seq_len", seq_len)
    d = check_positive_int("head_dim", head_dim)
    b = check_positive_int("block_rows", block_rows)
    if kv_reuse not in KV_REUSE:
        raise ValueError(f"kv_reuse must be one of {KV_REUSE}, got {kv_reuse!r}")
    kv_passes = math.ceil(n / b) if kv_reuse == "none" else 1
    standard = (4 * n * d + 4 * n * n) * element_size
    flash = (2 * n * d + 2 * kv_passes * n * d) * element_size + 4 * n
    return float(standard), float(flash)


def kv_l2_to_sm_bytes(seq_len: int, head_dim: int, element_size: int = 2, block_rows: int = 128) -> float:
    """Bytes of K and V that one head's row tiles load into their SMs: ``2 T_r N d`` elements.

    The paper's count of re-reads, whatever level serves them: with L2 reuse
    this is traffic between the L2 cache and the SMs, not HBM traffic. Its
    intensity, ``4 N^2 d / (2 T_r N d b) = 2 B_r / b`` FLOPs per byte (``B_r``
    in fp16), is what the tile height buys.
    """
    n = check_positive_int("seq_len", seq_len)
    d = check_positive_int("head_dim", head_dim)
    b = check_positive_int("block_rows", block_rows)
    return float(2 * math.ceil(n / b) * n * d * element_size)


def kv_working_set_bytes(seq_len: int, head_dim: int, programs_in_flight: int, element_size: int = 2,
                         block_rows: int = 128) -> float:
    """K and V bytes of every head that has a program running, with the grid walked row tile first.

    The grid of FlashAttention-2 is ``(T_r, batch * heads)``, and a GPU starts
    programs in that order, row tiles of one head first. ``programs_in_flight``
    consecutive programs (SMs times programs per SM) touch at most
    ``ceil((P - 1) / T_r) + 1`` heads, each with ``2 N d`` elements of K and V.
    When this fits in the L2 cache, re-reads hit L2 and HBM sees K/V
    once per head (``kv_reuse="l2"`` of :func:`attention_hbm_bytes`).
    """
    n = check_positive_int("seq_len", seq_len)
    d = check_positive_int("head_dim", head_dim)
    p = check_positive_int("programs_in_flight", programs_in_flight)
    b = check_positive_int("block_rows", block_rows)
    heads = math.ceil((p - 1) / math.ceil(n / b)) + 1
    return float(heads * 2 * n * d * element_size)
