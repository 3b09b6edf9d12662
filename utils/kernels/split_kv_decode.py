"""Split-KV decode attention over the paged cache (Flash-Decoding), with GQA packing, in Triton.

One decode step attends one new query per sequence and head to the whole cache. The unsplit kernel
(:func:`utils.kernels.paged_attention.paged_decode`) runs one program per (sequence, query head): a
single 32K-token sequence with 32 heads launches 32 programs on a GPU with 132 SMs, and each walks
all 32K keys alone. Flash-Decoding (Dao, Haziza, Massa and Sizov, PyTorch blog, October 2023) splits
the keys and values of each sequence into ``num_splits`` chunks handled in parallel, and merges the
partial results with their log-sum-exp. For split ``i`` with scores ``s_i`` and values ``V_i``::

    o_i = softmax(s_i) V_i                lse_i = log sum_j exp(s_ij)
    o   = sum_i exp(lse_i - LSE) o_i      LSE   = log sum_i exp(lse_i)

which is exactly ``softmax(s) V`` over all the keys (the same rescaling as the online softmax).

Kernel 1 (:func:`_split_kv_kernel`), program ``(sequence, KV head, split)``: **GQA packing** -- the
``group = n_heads / n_kv_heads`` query heads that share a KV head are one ``(group, head_dim)`` tile,
so every key and value is loaded once for the whole group (FlashInfer does the same: its decode grid
is batch x KV heads, Ye et al. 2025, arXiv:2501.01005). The program walks its chunk in tiles of
``BLOCK_N`` tokens, looking up each token's physical block in the block table, and writes its
partial output and log-sum-exp. Kernel 2 (:func:`_merge_kernel`), program ``(sequence, query head)``,
merges the splits; :func:`merge_partials` is the same merge in PyTorch.

Under Triton's interpreter it runs on a CPU (fp32 and fp16; bf16 is refused there).
"""

from __future__ import annotations

import math

import torch

from utils.attention.paged_cache import PagedKVCache
from utils.device import HAS_CUDA, INTERPRETER, check_dtype
from utils.kernels.paged_attention import block_tables_tensor
from utils.kernels.triton_or_stand_in import tl, triton

DEFAULT_BLOCK_N = 64
"""Tokens per tile of the inner loop (any power of two >= 16; independent of the cache's block size)."""
MIN_TOKENS_PER_SPLIT = 128
"""The smallest chunk :func:`choose_num_splits` makes: FlashInfer's decode planner gives a chunk at least
``max(128 / page_size, 1)`` pages (``PartitionPagedKVCacheBinarySearchMinNumPagePerBatch``)."""
CPU_STAND_IN_SMS = 8
"""The SM count :func:`split_kv_attention` assumes without a GPU, so the interpreter runs tens of programs."""


@triton.jit
def _split_kv_kernel(Q, K, V, O_PART, LSE, TABLES, LENGTHS, sm_scale, num_splits,
                     s_qs, s_qh, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh, s_ts, s_os, s_oh, s_op, s_ls, s_lh,
                     GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, FP32: tl.constexpr):
    """Program (s, g, i): the partial attention of query heads g*GROUP .. (g+1)*GROUP - 1 of sequence s over chunk i."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    rows = tl.arange(0, GROUP_PAD)                    # the group's query heads, padded to >= 16 for tl.dot
    heads = kv_head * GROUP + rows
    is_head = rows < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + seq * s_qs + heads[:, None] * s_qh + dims[None, :], mask=is_head[:, None], other=0.0)
    length = tl.load(LENGTHS + seq)
    chunk = tl.cdiv(tl.cdiv(length, num_splits), BLOCK_N) * BLOCK_N   # tokens per split, whole tiles
    start = split * chunk
    end = tl.minimum(start + chunk, length)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for t0 in range(start, end, BLOCK_N):
        tokens = t0 + tl.arange(0, BLOCK_N)
        valid = tokens < end
        block = tl.load(TABLES + seq * s_ts + tokens // BLOCK_SIZE, mask=valid, other=0)  # block table lookup
        slot = tokens % BLOCK_SIZE
        k = tl.load(K + block[:, None] * s_kb + slot[:, None] * s_ks + kv_head * s_kh + dims[None, :],
                    mask=valid[:, None], other=0.0)
        if FP32:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(valid[None, :], s * sm_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        v = tl.load(V + block[:, None] * s_vb + slot[:, None] * s_vs + kv_head * s_vh + dims[None, :],
                    mask=valid[:, None], other=0.0)
        l = l * alpha + tl.sum(p, 1)
        if FP32:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    nonempty = l > 0                                   # a split past the end of a short sequence is empty
    out = tl.where(nonempty[:, None], acc / tl.where(nonempty, l, 1.0)[:, None], 0.0)
    lse = tl.where(nonempty, m + tl.log(tl.where(nonempty, l, 1.0)), float("-inf"))
    tl.store(O_PART + seq * s_os + heads[:, None] * s_oh + split * s_op + dims[None, :], out, mask=is_head[:, None])
    tl.store(LSE + seq * s_ls + heads * s_lh + split, lse, mask=is_head)


@triton.jit
def _merge_kernel(O_PART, LSE, OUT, num_splits, s_os, s_oh, s_op, s_ls, s_lh, s_outs, s_outh,
                  HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr):
    """Program (s, h): o = sum_i exp(lse_i - LSE) o_i over the splits of sequence s, head h."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    used = splits < num_splits
    dims = tl.arange(0, HEAD_DIM)
    lse = tl.load(LSE + seq * s_ls + head * s_lh + splits, mask=used, other=float("-inf"))
    weight = tl.exp(lse - tl.max(lse, 0))              # empty splits have lse = -inf: weight 0
    part = tl.load(O_PART + seq * s_os + head * s_oh + splits[:, None] * s_op + dims[None, :],
                   mask=used[:, None], other=0.0)
    out = tl.sum(weight[:, None] * part, 0) / tl.sum(weight, 0)
    tl.store(OUT + seq * s_outs + head * s_outh + dims, out.to(OUT.dtype.element_ty))


def merge_partials(o_part: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """The log-sum-exp merge in PyTorch: ``o = sum_i softmax(lse)_i o_i``.

    ``o_part``: ``(..., num_splits, head_dim)`` partial outputs, each normalised over its own chunk;
    ``lse``: ``(..., num_splits)``, ``-inf`` for an empty chunk. Returns ``(..., head_dim)`` in fp32.
    """
    if o_part.shape[:-1] != lse.shape:
        raise ValueError(f"o_part must be lse's shape plus head_dim; got {tuple(o_part.shape)} and {tuple(lse.shape)}")
    weights = torch.softmax(lse.float(), dim=-1)
    return (weights[..., None] * o_part.float().nan_to_num()).sum(dim=-2)


def choose_num_splits(batch: int, n_kv_heads: int, max_len: int, n_sms: int, block_size: int = 16,
                      programs_per_sm: int = 2, min_tokens_per_split: int = MIN_TOKENS_PER_SPLIT) -> int:
    """How many chunks to cut each sequence into so that one decode step fills the GPU.

    The kernel runs ``batch * n_kv_heads * num_splits`` programs. If ``batch * n_kv_heads`` already fills
    ``n_sms * programs_per_sm`` program slots, splitting only adds merge traffic: 1. Otherwise take as many
    splits as fill the slots in one wave, ``floor(slots / (batch * n_kv_heads))``, but no chunk shorter than
    ``min_tokens_per_split`` tokens (rounded up to whole ``block_size`` blocks) and no more splits than blocks.

    This is FlashInfer's decode plan (Ye et al. 2025, arXiv:2501.01005; ``max_grid_size = num_blocks_per_sm
    * num_sm`` and no split when ``batch_size * num_kv_heads >= max_grid_size``), in closed form.
    FlashAttention-2's ``num_splits_heuristic`` (Dao-AILab/flash-attention, ``flash_api.cpp``) is similar: no
    split above 80 % of the SMs, else the fewest splits within 85 % of the best wave efficiency.
    Example: one sequence, 8 KV heads, 132 SMs, 2 programs per SM: 264 slots, 33 splits.
    """
    for name, value in (("batch", batch), ("n_kv_heads", n_kv_heads), ("max_len", max_len), ("n_sms", n_sms),
                        ("block_size", block_size), ("programs_per_sm", programs_per_sm),
                        ("min_tokens_per_split", min_tokens_per_split)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    programs, slots = batch * n_kv_heads, n_sms * programs_per_sm
    if programs >= slots:
        return 1
    n_blocks = -(-max_len // block_size)
    min_blocks = -(-min_tokens_per_split // block_size)
    return max(1, min(slots // programs, n_blocks // min_blocks))


def check_decode_inputs(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor, tables: torch.Tensor,
                        lengths: torch.Tensor) -> tuple[int, int, int, int, int]:
    """Check the shapes of a paged decode step; ``(n_seqs, n_heads, head_dim, block_size, n_kv_heads)``.

    ``q``: ``(n_seqs, n_heads, head_dim)``; pools ``(num_blocks, block_size, n_kv_heads, head_dim)`` with
    ``n_heads`` a multiple of ``n_kv_heads``; ``tables`` ``(n_seqs, max_blocks)``; ``lengths`` ``(n_seqs,)``.
    """
    if q.dim() != 3 or k_blocks.dim() != 4 or v_blocks.shape != k_blocks.shape:
        raise ValueError(f"q must be (n_seqs, n_heads, head_dim) and both pools (num_blocks, block_size, "
                         f"n_kv_heads, head_dim); got {tuple(q.shape)}, {tuple(k_blocks.shape)}, "
                         f"{tuple(v_blocks.shape)}")
    n_seqs, n_heads, head_dim = q.shape
    _, block_size, n_kv_heads, d = k_blocks.shape
    if d != head_dim or n_heads % n_kv_heads:
        raise ValueError(f"q's head_dim ({head_dim}) must equal the cache's ({d}) and its {n_heads} heads must be a "
                         f"multiple of the cache's {n_kv_heads} KV heads")
    if tables.dim() != 2 or tables.shape[0] != n_seqs or lengths.shape != (n_seqs,):
        raise ValueError(f"tables must be (n_seqs, max_blocks) and lengths (n_seqs,) with n_seqs = {n_seqs}; "
                         f"got {tuple(tables.shape)} and {tuple(lengths.shape)}")
    return n_seqs, n_heads, head_dim, block_size, n_kv_heads


def split_kv_decode(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor, tables: torch.Tensor,
                    lengths: torch.Tensor, num_splits: int, sm_scale: float | None = None,
                    block_n: int = DEFAULT_BLOCK_N, return_partials: bool = False):
    """One decode step of attention, split ``num_splits`` ways per sequence, from the tensors an engine keeps.

    Arguments as :func:`utils.kernels.paged_attention.paged_decode` (``q``: ``(n_seqs, n_heads, head_dim)``;
    pools ``(num_blocks, block_size, n_kv_heads, head_dim)``; ``tables`` int32 ``(n_seqs, max_blocks)``;
    ``lengths`` int32, each >= 1). Returns ``(n_seqs, n_heads, head_dim)`` in ``q``'s dtype, and with
    ``return_partials`` also the fp32 partial outputs ``(n_seqs, n_heads, num_splits, head_dim)`` and their
    log-sum-exps ``(n_seqs, n_heads, num_splits)``.
    """
    check_dtype(q.dtype)
    n_seqs, n_heads, head_dim, block_size, n_kv_heads = check_decode_inputs(q, k_blocks, v_blocks, tables, lengths)
    if not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be a positive integer, got {num_splits!r}")
    for name, value, low in (("block_size", block_size, 1), ("head_dim", head_dim, 16), ("block_n", block_n, 16)):
        if value < low or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= {low} for this kernel, got {value}")
    if q.dtype != k_blocks.dtype or q.device != k_blocks.device:
        raise ValueError(f"q ({q.dtype}, {q.device}) must match the cache ({k_blocks.dtype}, {k_blocks.device})")
    if q.device.type != "cuda" and not INTERPRETER:
        raise ValueError(f"compiled Triton kernels read GPU memory, but q is on {q.device}: move the tensors to "
                         "'cuda', or set TRITON_INTERPRET=1")
    group = n_heads // n_kv_heads
    q = q.contiguous()
    o_part = torch.empty(n_seqs, n_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(n_seqs, n_heads, num_splits, dtype=torch.float32, device=q.device)
    scale = 1 / math.sqrt(head_dim) if sm_scale is None else sm_scale
    _split_kv_kernel[(n_seqs, n_kv_heads, num_splits)](
        q, k_blocks, v_blocks, o_part, lse, tables, lengths, scale, num_splits,
        q.stride(0), q.stride(1), k_blocks.stride(0), k_blocks.stride(1), k_blocks.stride(2),
        v_blocks.stride(0), v_blocks.stride(1), v_blocks.stride(2), tables.stride(0),
        o_part.stride(0), o_part.stride(1), o_part.stride(2), lse.stride(0), lse.stride(1),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, FP32=q.dtype == torch.float32)
    out = torch.empty_like(q)
    _merge_kernel[(n_seqs, n_heads)](
        o_part, lse, out, num_splits, o_part.stride(0), o_part.stride(1), o_part.stride(2),
        lse.stride(0), lse.stride(1), out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)))
    return (out, o_part, lse) if return_partials else out


def split_kv_attention(q: torch.Tensor, cache: PagedKVCache, seq_ids: list[int], num_splits: int | None = None,
                       sm_scale: float | None = None) -> torch.Tensor:
    """:func:`split_kv_decode` for ``seq_ids`` of a :class:`~utils.attention.paged_cache.PagedKVCache`.

    ``num_splits`` defaults to :func:`choose_num_splits` for this GPU's SM count (on a CPU,
    :data:`CPU_STAND_IN_SMS`). Equals :func:`utils.attention.paged_attention.paged_attention`.
    """
    if q.dim() != 3 or q.shape[0] != len(seq_ids):
        raise ValueError(f"q must have shape ({len(seq_ids)}, n_heads, head_dim), got {tuple(q.shape)}")
    tables, lengths = block_tables_tensor(cache, seq_ids)
    if num_splits is None:
        n_sms = torch.cuda.get_device_properties(q.device).multi_processor_count \
            if HAS_CUDA and q.device.type == "cuda" else CPU_STAND_IN_SMS
        num_splits = choose_num_splits(len(seq_ids), cache.n_kv_heads, int(lengths.max()), n_sms, cache.block_size)
    return split_kv_decode(q, cache.k_blocks, cache.v_blocks, tables, lengths, num_splits, sm_scale)
