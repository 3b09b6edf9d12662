"""Decode attention that reads keys and values through a paged cache's block tables.

Kwon et al., "Efficient Memory Management for Large Language Model Serving
with PagedAttention" (SOSP 2023, arXiv:2309.06180), section 4.1: the keys and
values of a sequence lie in blocks scattered over the pool, so the kernel
fetches them block by block, following the sequence's block table, and
combines the partial results. For one new query ``q`` per sequence and head,

    o = sum_j softmax(q K^T / sqrt(d))_j v_j

is computed here one block ``B`` at a time with the online softmax
(Milakov and Gimelshein, arXiv:1805.02867; the same rescaling as
FlashAttention): keep the running maximum ``m``, the running denominator
``l`` and the running numerator ``acc``; for each block's scores ``s_B``,
``m' = max(m, max s_B)``, ``l = l e^{m - m'} + sum e^{s_B - m'}``,
``acc = acc e^{m - m'} + e^{s_B - m'} V_B``, and finally ``o = acc / l``.
No contiguous copy of the sequence's cache is ever made.

:func:`contiguous_attention` is the reference it must equal: the same
attention over keys and values stored contiguously.
"""

from __future__ import annotations

import math

import torch

from utils.attention.paged_cache import PagedKVCache


def _check_query(q: torch.Tensor, n_kv_heads: int, head_dim: int) -> tuple[int, int]:
    if q.dim() != 3 or q.shape[-1] != head_dim:
        raise ValueError(f"q must have shape (n_seqs, n_heads, {head_dim}), got {tuple(q.shape)}")
    n_heads = q.shape[1]
    if n_heads % n_kv_heads:
        raise ValueError(f"the number of query heads ({n_heads}) must be a multiple of the number of KV heads "
                         f"({n_kv_heads}), as in grouped-query attention")
    return q.shape[0], n_heads // n_kv_heads


def contiguous_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
                         ) -> torch.Tensor:
    """Attention of one query per head over a contiguous cache: ``softmax(q K^T * scale) V``.

    ``q``: ``(n_heads, head_dim)``; ``k``, ``v``: ``(n_tokens, n_kv_heads, head_dim)``. Query head ``h``
    uses KV head ``h // (n_heads / n_kv_heads)`` (grouped-query attention; Ainslie et al.,
    arXiv:2305.13245). ``scale`` defaults to ``1 / sqrt(head_dim)``. Returns ``(n_heads, head_dim)``.
    """
    if k.dim() != 3 or v.shape != k.shape or k.shape[0] == 0:
        raise ValueError(f"k and v must both have shape (n_tokens >= 1, n_kv_heads, head_dim); "
                         f"got {tuple(k.shape)} and {tuple(v.shape)}")
    _, group = _check_query(q[None], k.shape[1], k.shape[2])
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    k = k.repeat_interleave(group, dim=1)  # (n_tokens, n_heads, d)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("hd,thd->ht", q, k) * scale
    return torch.einsum("ht,thd->hd", scores.softmax(dim=-1), v)


def paged_attention(q: torch.Tensor, cache: PagedKVCache, seq_ids: list[int], scale: float | None = None
                    ) -> torch.Tensor:
    """One decode step of attention for ``seq_ids``, reading each block once through its block table.

    ``q``: ``(n_seqs, n_heads, head_dim)``, row ``i`` the new query of sequence ``seq_ids[i]``. Each block
    is fetched with ``index_select`` on the pool and folded in with the online softmax (module
    docstring); the last block contributes only its ``length % block_size`` filled slots. Equals
    :func:`contiguous_attention` over ``cache.gather(seq)``. Returns ``(n_seqs, n_heads, head_dim)``.
    """
    n_seqs, group = _check_query(q, cache.n_kv_heads, cache.head_dim)
    if len(seq_ids) != n_seqs:
        raise ValueError(f"q has {n_seqs} rows but {len(seq_ids)} sequence ids were given; one query per sequence")
    scale = 1 / math.sqrt(cache.head_dim) if scale is None else scale
    out = torch.empty_like(q)
    for row, seq in enumerate(seq_ids):
        length, table = cache.length(seq), cache.block_table(seq)
        if length == 0:
            raise ValueError(f"sequence {seq} has no cached tokens to attend to")
        n_heads = q.shape[1]
        m = torch.full((n_heads,), -math.inf, dtype=torch.float32, device=q.device)
        l = torch.zeros(n_heads, dtype=torch.float32, device=q.device)
        acc = torch.zeros(n_heads, cache.head_dim, dtype=torch.float32, device=q.device)
        for i, block in enumerate(table):
            filled = min(cache.block_size, length - i * cache.block_size)
            index = torch.tensor([block], device=cache.k_blocks.device)
            k_b = cache.k_blocks.index_select(0, index)[0, :filled].repeat_interleave(group, dim=1).float()
            v_b = cache.v_blocks.index_select(0, index)[0, :filled].repeat_interleave(group, dim=1).float()
            s = torch.einsum("hd,thd->ht", q[row].float(), k_b) * scale  # (n_heads, filled)
            m_new = torch.maximum(m, s.amax(dim=-1))
            alpha, p = torch.exp(m - m_new), torch.exp(s - m_new[:, None])
            l = l * alpha + p.sum(dim=-1)
            acc = acc * alpha[:, None] + torch.einsum("ht,thd->hd", p, v_b)
            m = m_new
        out[row] = (acc / l[:, None]).to(q.dtype)
    return out
