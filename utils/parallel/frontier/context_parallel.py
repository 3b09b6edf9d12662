"""Context parallelism: ring attention over ranks that each hold a slice of the sequence.

Each of ``P`` ranks holds the queries, keys and values of ``S / P`` tokens.
Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers",
arXiv:2310.01889) passes the K/V blocks around a ring of ranks: at step ``t``
rank ``r`` holds the block of rank ``(r - t) mod P``, computes its queries'
scores against it and merges the partial result into a running one with the
online softmax of FlashAttention (:mod:`utils.attention.flash_reference`):

    m_new = max(m, rowmax(S_blk)),   l_new = exp(m - m_new) l + rowsum(exp(S_blk - m_new)),
    O_new = exp(m - m_new) O + exp(S_blk - m_new) V_blk,

keeping the log-sum-exp ``L = m + log l`` for backward. The backward is
FlashAttention-2's (Dao 2023, arXiv:2307.08691, Algorithm 2) block by block:
``P = exp(S - L)``, ``D = rowsum(dO * O)``, ``dS = P * (dO V^T - D)``; dQ stays
home while K, V and their gradient accumulators dK, dV travel the ring, and
after ``P`` hops the accumulators arrive back at the rank that owns them. K and
V travel in their own dtype, the accumulators in the accumulation dtype (fp32
for bf16, as ring-flash-attention keeps them). A step computes its block's
share of dK, dV into a fresh buffer while the block's accumulator is still on
its way from the left neighbour, and waits for it only to add the two, so each
dK/dV hop overlaps the next step's compute; only the last hop, which brings the
accumulators home, has nothing left to hide behind.

Causal masking needs each token's global position, which depends on how the
sequence was sharded (:data:`LAYOUTS`): ``"contiguous"`` gives rank ``r`` tokens
``[r S/P, (r + 1) S/P)``; ``"zigzag"`` splits the sequence into ``2P`` chunks
and gives rank ``r`` chunks ``r`` and ``2P - 1 - r`` (Llama 3, Dubey et al.
2024, arXiv:2407.21783, section 3.3.2), which balances the causal work
(:func:`ring_attention_work`). A block's rows that see none of its keys, and
keys that no row sees, are skipped, so ring attention computes the score
entries :func:`ring_attention_work` counts. With grouped-query attention only
the KV heads travel.

The cost model: a forward step sends ``2 b h_kv n d e`` bytes and computes up
to ``4 b h n^2 d`` FLOPs; a backward step sends K, V and the accumulators,
``2 b h_kv n d (e + e_grad)`` bytes, and computes ``10 b h n^2 d``
(:func:`ring_step_costs`); the transfer hides once ``n`` passes
:func:`min_local_seq_to_hide`, which :func:`ring_attention_seconds` checks step by step.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from utils.attention.flash_reference import accumulation_dtype, check_qkv
from utils.validate import (
    check_element_size,
    check_nonnegative,
    check_nonnegative_int,
    check_positive,
    check_positive_int,
)

LAYOUTS = ("contiguous", "zigzag")
"""How a sequence is split over context-parallel ranks: ``P`` equal slices, or ``2P`` chunks paired i with 2P-1-i."""


def _check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def _n_chunks(world_size: int, layout: str) -> int:
    return world_size if _check_layout(layout) == "contiguous" else 2 * world_size


def chunk_ids(rank: int, world_size: int, layout: str) -> tuple[int, ...]:
    """The chunks of the sequence rank ``rank`` holds, in order: ``(rank,)`` or ``(rank, 2P - 1 - rank)``."""
    p = check_positive_int("world_size", world_size)
    r = check_nonnegative_int("rank", rank)
    if r >= p:
        raise ValueError(f"rank must be in [0, {p}), got {r}")
    return (r,) if _check_layout(layout) == "contiguous" else (r, 2 * p - 1 - r)


def _check_seq_len(seq_len: int, world_size: int, layout: str) -> int:
    n = check_positive_int("seq_len", seq_len)
    chunks = _n_chunks(check_positive_int("world_size", world_size), layout)
    if n % chunks:
        raise ValueError(f"the {layout!r} layout splits the sequence into {chunks} equal chunks "
                         f"({'P' if layout == 'contiguous' else '2P'} for P = {world_size} ranks); "
                         f"a length of {n} is not divisible by {chunks}")
    return n


def _chunk_ranges(seq_len: int, rank: int, world_size: int, layout: str) -> list[tuple[int, int]]:
    """``[start, stop)`` of each chunk rank ``rank`` holds, in the order :func:`shard_sequence` stores them."""
    n = _check_seq_len(seq_len, world_size, layout)
    c = n // _n_chunks(world_size, layout)
    return [(i * c, (i + 1) * c) for i in chunk_ids(rank, world_size, layout)]


def positions(seq_len: int, rank: int, world_size: int, layout: str) -> torch.Tensor:
    """The global positions (int64) of rank ``rank``'s tokens, in the order :func:`shard_sequence` stores them."""
    return torch.cat([torch.arange(a, b) for a, b in _chunk_ranges(seq_len, rank, world_size, layout)])


def _check_dim(x: torch.Tensor, dim: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"expected a torch.Tensor, got {type(x).__name__}")
    if not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be an int in [{-x.dim()}, {x.dim()}) for a {x.dim()}-D tensor, got {dim!r}")
    return dim % x.dim()


def shard_sequence(x: torch.Tensor, rank: int, world_size: int, layout: str = "contiguous",
                   dim: int = 2) -> torch.Tensor:
    """Rank ``rank``'s tokens of the full ``x`` along ``dim`` (a contiguous copy), in the given layout.

    ``"contiguous"``: slice ``rank`` of ``P``; ``"zigzag"``: chunks ``rank`` and
    ``2P - 1 - rank`` of ``2P``, concatenated. ``ValueError`` if the layout
    cannot split the length into equal chunks.
    """
    d = _check_dim(x, dim)
    idx = positions(x.shape[d], rank, world_size, layout).to(x.device)
    return x.index_select(d, idx).contiguous()


def unshard_sequence(chunks: list[torch.Tensor], layout: str = "contiguous", dim: int = 2) -> torch.Tensor:
    """The full sequence from every rank's shard (``chunks[r]`` from rank ``r``); inverts :func:`shard_sequence`."""
    if not isinstance(chunks, (list, tuple)) or not chunks:
        raise ValueError("chunks must be a non-empty list of tensors, one per rank in rank order")
    p = len(chunks)
    d = _check_dim(chunks[0], dim)
    if any(not isinstance(c, torch.Tensor) or c.shape != chunks[0].shape for c in chunks):
        raise ValueError(f"every rank's shard must have the same shape, got {[tuple(c.shape) for c in chunks]}")
    full = torch.cat(list(chunks), dim=d)
    order = torch.cat([positions(full.shape[d], r, p, layout) for r in range(p)]).to(full.device)
    return full.index_select(d, torch.argsort(order))  # full holds position order[j] at index j


def _active(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Indices of the query rows that see some key of the block, and of the keys some row sees (None: nothing)."""
    if not causal:
        return torch.arange(len(q_pos)), torch.arange(len(k_pos))
    rows = torch.nonzero(q_pos >= k_pos.min()).flatten()
    cols = torch.nonzero(k_pos <= q_pos.max()).flatten()
    return (rows, cols) if len(rows) else None


def ring_attention_work(seq_len: int, world_size: int, layout: str = "contiguous",
                        causal: bool = True) -> list[list[int]]:
    """Score entries ``work[rank][step]`` that :func:`ring_attention` computes, per (batch, head).

    At ring step ``t`` rank ``r`` computes (rows that see some key) x (keys some
    row sees) of the block of rank ``(r - t) mod P``; a fully masked block costs
    nothing. Forward FLOPs are ``4 * head_dim`` per entry (``QK^T`` and ``PV``).
    Contiguous and causal: rank ``r`` computes ``r + 1`` full blocks, so the last
    rank does ``P`` times the first's work; zigzag: ``(2P + 2) (S / 2P)^2`` on every rank.
    """
    _check_seq_len(seq_len, world_size, layout)
    ranges = [_chunk_ranges(seq_len, r, world_size, layout) for r in range(world_size)]
    return [[_active_count(ranges[r], ranges[(r - t) % world_size], causal) for t in range(world_size)]
            for r in range(world_size)]


def _active_count(q_ranges: list[tuple[int, int]], k_ranges: list[tuple[int, int]], causal: bool) -> int:
    """What :func:`_active` selects, (rows) x (keys), counted from the chunks' ranges without building positions."""
    n_rows, n_keys = (sum(b - a for a, b in ranges) for ranges in (q_ranges, k_ranges))
    if causal:
        k_min, q_stop = min(a for a, _ in k_ranges), max(b for _, b in q_ranges)
        n_rows = sum(max(0, b - max(a, k_min)) for a, b in q_ranges)  # rows at or after the first key
        n_keys = sum(max(0, min(b, q_stop) - a) for a, b in k_ranges)  # keys at or before the last row
    return n_rows * n_keys


def ring_step_costs(local_seq: int, heads: int, kv_heads: int, head_dim: int, batch: int = 1,
                    element_size: int = 2, backward: bool = False, grad_element_size: int = 4) -> tuple[float, float]:
    """``(bytes, flops)`` of one full ring step on one rank: what it sends, what it computes.

    Forward: bytes ``= 2 b h_kv n d e`` (K and V of ``n = S/P`` tokens, ``h_kv``
    KV heads, ``e`` bytes per element); FLOPs ``= 4 b h n^2 d`` (``QK^T`` and ``PV``).
    Backward (``backward=True``): K and V again plus the dK, dV accumulators,
    which :func:`ring_attention` sends in the accumulation dtype
    (``grad_element_size``, 4 for fp32): bytes ``= 2 b h_kv n d (e + e_grad)``,
    three times the forward's for bf16; FLOPs ``= 10 b h n^2 d``, the five block
    products of FlashAttention-2's backward (``QK^T`` again, ``dV``, ``dP``,
    ``dQ``, ``dK``), 2.5 times the forward's. A causal zigzag step other than the
    first computes half of that.
    """
    n, h = check_positive_int("local_seq", local_seq), check_positive_int("heads", heads)
    hkv, d = check_positive_int("kv_heads", kv_heads), check_positive_int("head_dim", head_dim)
    b, e = check_positive_int("batch", batch), check_element_size(element_size)
    e_grad = check_element_size(grad_element_size)
    if h % hkv:
        raise ValueError(f"heads ({h}) must be a multiple of kv_heads ({hkv}) (grouped-query attention)")
    if backward:
        return float(2 * b * hkv * n * d * (e + e_grad)), float(10 * b * h * n * n * d)
    return float(2 * b * hkv * n * d * e), float(4 * b * h * n * n * d)


def min_local_seq_to_hide(heads: int, kv_heads: int, flops_per_s: float, bandwidth_bytes_per_s: float,
                          element_size: int = 2, compute_fraction: float = 1.0, backward: bool = False,
                          grad_element_size: int = 4) -> float:
    """Tokens per rank above which a ring step's transfer hides behind its attention compute.

    Forward: setting ``2 b h_kv n d e / B = f * 4 b h n^2 d / R`` (bytes over
    link bandwidth ``B`` equal to FLOPs over rate ``R``, of which a fraction
    ``f`` is computed: 1 non-causal, 1/2 for a causal zigzag step) gives
    ``n* = e R h_kv / (2 f h B)``. Backward (``backward=True``, the bytes and
    FLOPs of :func:`ring_step_costs`): ``2 b h_kv n d (e + e_grad) / B = f * 10 b h n^2 d / R``
    gives ``n* = (e + e_grad) R h_kv / (5 f h B)``, 1.2 times the forward's for
    bf16 with fp32 accumulators. Batch and head_dim cancel. Multiply by ``P``
    for the sequence length.
    """
    h, hkv = check_positive_int("heads", heads), check_positive_int("kv_heads", kv_heads)
    rate = check_positive("flops_per_s", flops_per_s, finite=True)
    bw = check_positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s, finite=True)
    f = check_positive("compute_fraction", compute_fraction, finite=True)
    if f > 1:
        raise ValueError(f"compute_fraction must be in (0, 1], got {f}")
    e, e_grad = check_element_size(element_size), check_element_size(grad_element_size)
    if backward:
        return (e + e_grad) * rate * hkv / (5 * f * h * bw)
    return e * rate * hkv / (2 * f * h * bw)


def ring_attention_seconds(seq_len: int, world_size: int, heads: int, kv_heads: int, head_dim: int,
                           flops_per_s: float, bandwidth_bytes_per_s: float, layout: str = "contiguous",
                           causal: bool = True, batch: int = 1, element_size: int = 2,
                           latency_s: float = 0.0, backward: bool = False, grad_element_size: int = 4) -> float:
    """Time of ring attention's forward (or ``backward``), simulated step by step with the transfers overlapped.

    Step ``t`` takes ``max(compute, transfer)``: compute is the slowest rank's
    :func:`ring_attention_work` at that step times ``4 b h d`` FLOPs (backward:
    ``10 b h d``) over ``flops_per_s``; transfer is what the link carries during
    the step over ``bandwidth_bytes_per_s``, plus ``latency_s``: the next K/V
    block on the first ``P - 1`` steps, and in the backward also the previous
    step's dK/dV accumulators (``grad_element_size`` bytes each) on the last
    ``P - 1`` steps. The backward ends with one more dK/dV hop, exposed: it
    brings the accumulators home. The closed form :func:`min_local_seq_to_hide`
    says when transfer never wins a step.
    """
    work = ring_attention_work(seq_len, world_size, layout, causal)  # validates seq_len, world_size, layout
    p = world_size
    kv_bytes, _ = ring_step_costs(seq_len // p, heads, kv_heads, head_dim, batch, element_size)
    grad_bytes = kv_bytes * check_element_size(grad_element_size) / element_size if backward else 0.0
    rate = check_positive("flops_per_s", flops_per_s, finite=True)
    bw = check_positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s, finite=True)
    latency = float(check_nonnegative("latency_s", latency_s, finite=True))
    flops_per_entry = (10 if backward else 4) * batch * heads * head_dim
    total = 0.0
    for t in range(p):
        compute = max(w[t] for w in work) * flops_per_entry / rate
        nbytes = (kv_bytes if t < p - 1 else 0.0) + (grad_bytes if t > 0 else 0.0)
        total += max(compute, nbytes / bw + latency if nbytes else 0.0)
    if grad_bytes and p > 1:
        total += grad_bytes / bw + latency  # the last dK/dV hop: nothing is left to compute behind it
    return total


def _start_ring_send(tensor: torch.Tensor, group, right: int, left: int, tag: int = 0):
    """Post the send of ``tensor`` to ``right`` and the receive of its successor from ``left``; return (recv, works)."""
    recv = torch.empty_like(tensor)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, right, group, tag),
                                    dist.P2POp(dist.irecv, recv, left, group, tag)])
    return recv, works


def _ring_info(group):
    p, r = dist.get_world_size(group), dist.get_rank(group)
    peer = (lambda i: dist.get_global_rank(group, i)) if group is not None else (lambda i: i)  # noqa: E731
    return p, r, peer((r + 1) % p), peer((r - 1) % p)


def _heads(t: torch.Tensor, groups: int) -> torch.Tensor:
    """K or V with each KV head repeated for its ``groups`` query heads (GQA, as SDPA's ``enable_gqa``)."""
    return t.repeat_interleave(groups, dim=1) if groups > 1 else t


def _fold(t: torch.Tensor, groups: int) -> torch.Tensor:
    """The gradient of :func:`_heads`: sum each KV head's ``groups`` query-head copies."""
    return t.unflatten(1, (t.shape[1] // groups, groups)).sum(2) if groups > 1 else t


def _scores(q, k, rows, cols, q_pos, k_pos, causal, scale):
    s = q.index_select(2, rows) @ k.index_select(2, cols).transpose(-2, -1) * scale
    if causal:
        s = s.masked_fill(k_pos[cols][None, :] > q_pos[rows][:, None], -math.inf)
    return s


class RingAttention(torch.autograd.Function):
    """Forward: K/V blocks around the ring, merged by online softmax. Backward: K, V, dK, dV around the ring."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, layout: str, group):
        p, r, right, left = _ring_info(group)
        seq = q.shape[2] * p
        pos = [positions(seq, i, p, layout) for i in range(p)]
        acc_dtype = accumulation_dtype(q.dtype)
        qa, g = q.to(acc_dtype), q.shape[1] // k.shape[1]
        m = torch.full(q.shape[:3], -math.inf, dtype=acc_dtype, device=q.device)
        l, acc = torch.zeros_like(m), torch.zeros_like(qa)
        kv = torch.stack([k, v]).contiguous()
        for t in range(p):
            works = []
            if t < p - 1:  # post the next block's transfer before computing on this one (overlap)
                nxt, works = _start_ring_send(kv, group, right, left)
            src = (r - t) % p
            act = _active(pos[r], pos[src], causal)
            if act is not None:
                rows, cols = (i.to(q.device) for i in act)
                q_pos, k_pos = pos[r].to(q.device), pos[src].to(q.device)
                s = _scores(qa, _heads(kv[0].to(acc_dtype), g), rows, cols, q_pos, k_pos, causal, scale)
                m_old = m[:, :, rows]
                m_new = torch.maximum(m_old, s.amax(-1))
                m_safe = torch.where(torch.isinf(m_new), 0.0, m_new)  # a row masked so far: nothing to rescale
                pr = torch.exp(s - m_safe[..., None])
                alpha = torch.exp(m_old - m_safe)
                l[:, :, rows] = alpha * l[:, :, rows] + pr.sum(-1)
                v_blk = _heads(kv[1].to(acc_dtype).index_select(2, cols), g)
                acc[:, :, rows] = alpha[..., None] * acc[:, :, rows] + pr @ v_blk
                m[:, :, rows] = m_new
            for w in works:
                w.wait()
            if t < p - 1:
                kv = nxt
        out = (acc / l[..., None]).to(q.dtype)
        ctx.save_for_backward(q, k, v, out, m + torch.log(l))
        ctx.args = (causal, scale, layout, group)
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        causal, scale, layout, group = ctx.args
        p, r, right, left = _ring_info(group)
        pos = [positions(q.shape[2] * p, i, p, layout).to(q.device) for i in range(p)]
        acc_dtype = accumulation_dtype(q.dtype)
        qa, do, g = q.to(acc_dtype), d_out.to(acc_dtype), q.shape[1] // k.shape[1]
        delta = (do * out.to(acc_dtype)).sum(-1)  # D = rowsum(dO * O)
        dq = torch.zeros_like(qa)
        kv = torch.stack([k, v]).contiguous()  # K/V travel in their own dtype, as in the forward
        dkv, d_works = None, []  # the accumulators of the block held now (acc_dtype), and their hop in flight
        for t in range(p):
            kv_works = []
            if t < p - 1:  # K/V can leave at once
                nxt, kv_works = _start_ring_send(kv, group, right, left, tag=0)
            src = (r - t) % p
            part = torch.zeros(kv.shape, dtype=acc_dtype, device=q.device)  # this step's share of the block's dK, dV
            act = _active(pos[r].cpu(), pos[src].cpu(), causal)
            if act is not None:
                rows, cols = (i.to(q.device) for i in act)
                kva = kv.to(acc_dtype)
                kc, vc = (_heads(x.index_select(2, cols), g) for x in kva)
                s = _scores(qa, _heads(kva[0], g), rows, cols, pos[r], pos[src], causal, scale)
                pr = torch.exp(s - lse[:, :, rows, None])  # P recomputed from the saved log-sum-exp
                do_r = do.index_select(2, rows)
                part[1].index_add_(2, cols, _fold(pr.transpose(-2, -1) @ do_r, g))
                ds = pr * (do_r @ vc.transpose(-2, -1) - delta[:, :, rows, None])
                dq.index_add_(2, rows, ds @ kc * scale)
                part[0].index_add_(2, cols, _fold(ds.transpose(-2, -1) @ qa.index_select(2, rows) * scale, g))
            for w in d_works:  # the block's accumulator, sent by the left neighbour after its step t - 1
                w.wait()
            dkv = part if t == 0 else dkv.add_(part)
            if p > 1:  # waited on after the next step's compute, so the hop overlaps it; P hops bring it home
                sent = dkv  # held until the next step has waited on its send
                dkv, d_works = _start_ring_send(sent, group, right, left, tag=1)
            for w in kv_works:
                w.wait()
            if t < p - 1:
                kv = nxt
        for w in d_works:  # the last hop: nothing is left to compute behind it
            w.wait()
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   group: dist.ProcessGroup | None = None, layout: str = "contiguous",
                   sm_scale: float | None = None) -> torch.Tensor:
    """This rank's rows of ``softmax(Q K^T * scale + mask) V`` over the whole sequence (differentiable).

    Call it on every rank of ``group`` (None: the default group) with this
    rank's ``(batch, heads, local_seq, head_dim)`` q, k, v (k and v may have fewer
    heads, a divisor of q's: grouped-query attention, and only those travel the ring), sharded along dim 2
    by :func:`shard_sequence` with the same ``layout`` and ``rank = dist.get_rank(group)``.
    ``layout`` only matters with ``causal``: it gives each token's global
    position. ``sm_scale`` defaults to ``1 / sqrt(head_dim)``. Every rank must
    pass the same shapes; the output has q's shape and dtype, accumulated in fp32 (fp64 for fp64).
    """
    check_qkv(q, k, v, causal, gqa=True)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k/v must hold the same tokens, got {q.shape[2]} and {k.shape[2]} per rank")
    if not dist.is_initialized():
        raise ValueError("ring_attention needs an initialised process group (use utils.dist.launch or torchrun)")
    _check_seq_len(q.shape[2] * dist.get_world_size(group), dist.get_world_size(group), layout)
    scale = 1 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    return RingAttention.apply(q, k, v, bool(causal), scale, layout, group)
