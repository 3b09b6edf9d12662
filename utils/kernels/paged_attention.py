"""PagedAttention's decode kernel in Triton: attention that reads K and V through block tables.

Kwon et al. (SOSP 2023, arXiv:2309.06180), sections 4.1 and 5.1: the keys and
values of a sequence sit in fixed-size blocks anywhere in one pool, so the
kernel looks up each block's physical number in the sequence's block table
before loading it. One program computes one (sequence, query head): it loads
the query, walks the sequence's blocks in table order, masks the unfilled
slots of the last block, and folds each block in with the online softmax
(running maximum ``m``, denominator ``l``, numerator ``acc``; the same update
as :func:`utils.attention.paged_attention.paged_attention`, whose PyTorch
loop it replaces). Query head ``h`` reads KV head ``h // group`` (GQA).

vLLM's own kernel gives a (sequence, head) to a thread block and each KV block
to a warp so its reads coalesce; this one keeps Triton's usual shape, one
program, vectors of ``BLOCK_SIZE`` slots by ``HEAD_DIM``. On a CPU it runs
under Triton's interpreter (fp32 and fp16; bf16 is refused there).
"""

from __future__ import annotations

import math

import torch

from utils.kernels.triton_or_stand_in import tl, triton
from utils.attention.paged_cache import PagedKVCache
from utils.device import INTERPRETER, check_dtype


@triton.jit
def _paged_decode_kernel(Q, K, V, O, TABLES, LENGTHS, sm_scale,
                         s_qs, s_qh, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh, s_os, s_oh, s_ts, group,
                         HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Program (s, h): o[s, h] = softmax(q[s, h] . K_s^T * sm_scale) V_s over the blocks of sequence s."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // group
    dims = tl.arange(0, HEAD_DIM)
    slots = tl.arange(0, BLOCK_SIZE)
    q = tl.load(Q + seq * s_qs + head * s_qh + dims).to(tl.float32)
    length = tl.load(LENGTHS + seq)
    m = tl.max(tl.full([BLOCK_SIZE], float("-inf"), tl.float32), 0)  # 0-d tensors, so the loop-carried
    l = tl.sum(tl.zeros([BLOCK_SIZE], tl.float32), 0)                # types stay the same when compiled
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for j in range(0, tl.cdiv(length, BLOCK_SIZE)):
        block = tl.load(TABLES + seq * s_ts + j)                    # the block table lookup
        filled = (j * BLOCK_SIZE + slots) < length                  # the last block may be partly empty
        k = tl.load(K + block * s_kb + slots[:, None] * s_ks + kv_head * s_kh + dims[None, :],
                    mask=filled[:, None], other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], 1) * sm_scale
        s = tl.where(filled, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)
        v = tl.load(V + block * s_vb + slots[:, None] * s_vs + kv_head * s_vh + dims[None, :],
                    mask=filled[:, None], other=0.0).to(tl.float32)
        l = l * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        m = m_new
    tl.store(O + seq * s_os + head * s_oh + dims, (acc / l).to(O.dtype.element_ty))


def block_tables_tensor(cache: PagedKVCache, seq_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The block tables of ``seq_ids`` as one ``(n_seqs, max_blocks)`` int32 tensor (padded with 0) and
    their lengths, on the cache's device: what a paged kernel reads instead of Python lists."""
    tables = [cache.block_table(s) for s in seq_ids]
    width = max((len(t) for t in tables), default=0) or 1
    padded = torch.zeros(len(tables), width, dtype=torch.int32)
    for row, table in enumerate(tables):
        padded[row, :len(table)] = torch.tensor(table, dtype=torch.int32)
    lengths = torch.tensor([cache.length(s) for s in seq_ids], dtype=torch.int32)
    dev = cache.k_blocks.device
    return padded.to(dev), lengths.to(dev)


def paged_attention_triton(q: torch.Tensor, cache: PagedKVCache, seq_ids: list[int],
                           sm_scale: float | None = None) -> torch.Tensor:
    """One decode step of attention for ``seq_ids`` through their block tables, in one kernel launch.

    ``q``: ``(n_seqs, n_heads, head_dim)`` on the cache's device, in the cache's dtype. ``block_size``
    and ``head_dim`` must be powers of two (``tl.arange``). Returns ``(n_seqs, n_heads, head_dim)``.
    """
    check_dtype(q.dtype)
    if q.dim() != 3 or q.shape[0] != len(seq_ids) or q.shape[2] != cache.head_dim:
        raise ValueError(f"q must have shape ({len(seq_ids)}, n_heads, {cache.head_dim}), got {tuple(q.shape)}")
    if q.shape[1] % cache.n_kv_heads:
        raise ValueError(f"the number of query heads ({q.shape[1]}) must be a multiple of the number of KV heads "
                         f"({cache.n_kv_heads})")
    for name, value in (("block_size", cache.block_size), ("head_dim", cache.head_dim)):
        if value & (value - 1):
            raise ValueError(f"{name} must be a power of two for this kernel, got {value}")
    if q.dtype != cache.k_blocks.dtype or q.device != cache.k_blocks.device:
        raise ValueError(f"q ({q.dtype}, {q.device}) must match the cache ({cache.k_blocks.dtype}, "
                         f"{cache.k_blocks.device})")
    if q.device.type != "cuda" and not INTERPRETER:
        raise ValueError(f"compiled Triton kernels read GPU memory, but q and the cache are on {q.device}: move "
                         "the cache with cache.to('cuda') and q with q.cuda(), or set TRITON_INTERPRET=1")
    tables, lengths = block_tables_tensor(cache, seq_ids)
    return paged_decode(q, cache.k_blocks, cache.v_blocks, tables, lengths, sm_scale)


def paged_decode(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor, tables: torch.Tensor,
                 lengths: torch.Tensor, sm_scale: float | None = None) -> torch.Tensor:
    """The kernel launch of :func:`paged_attention_triton`, from tensors an engine keeps on the GPU.

    ``k_blocks``, ``v_blocks``: the pools, ``(num_blocks, block_size, n_kv_heads, head_dim)``;
    ``tables``: ``(n_seqs, max_blocks)`` int32 physical block numbers; ``lengths``: ``(n_seqs,)`` int32,
    each >= 1 (unchecked here: reading them would synchronise with the GPU). A serving engine keeps the
    tables on the device and updates them in place, so a decode step launches this and nothing else; the
    benchmark times it this way. Returns ``(n_seqs, n_heads, head_dim)``.
    """
    if q.dim() != 3 or k_blocks.dim() != 4 or v_blocks.shape != k_blocks.shape:
        raise ValueError(f"q must be (n_seqs, n_heads, head_dim) and both pools (num_blocks, block_size, "
                         f"n_kv_heads, head_dim); got {tuple(q.shape)}, {tuple(k_blocks.shape)}, "
                         f"{tuple(v_blocks.shape)}")
    _, block_size, n_kv_heads, head_dim = k_blocks.shape
    if tables.dim() != 2 or tables.shape[0] != q.shape[0] or lengths.shape != (q.shape[0],):
        raise ValueError(f"tables must be (n_seqs, max_blocks) and lengths (n_seqs,) with n_seqs = {q.shape[0]}; "
                         f"got {tuple(tables.shape)} and {tuple(lengths.shape)}")
    q = q.contiguous()
    out = torch.empty_like(q)
    scale = 1 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    _paged_decode_kernel[(q.shape[0], q.shape[1])](
        q, k_blocks, v_blocks, out, tables, lengths, scale,
        q.stride(0), q.stride(1), k_blocks.stride(0), k_blocks.stride(1), k_blocks.stride(2),
        v_blocks.stride(0), v_blocks.stride(1), v_blocks.stride(2),
        out.stride(0), out.stride(1), tables.stride(0), q.shape[1] // n_kv_heads,
        HEAD_DIM=head_dim, BLOCK_SIZE=block_size)
    return out
