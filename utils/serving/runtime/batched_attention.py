"""Decode attention for every decoding request of an engine step in one call, over the paged cache.

In :func:`utils.serving.runtime.paged_forward.forward_segments` the linear layers already run once over all the
step's tokens; attention, done request by request, costs a dozen small operations per request per layer.
A decode segment (one new token at position ``p``) attends to the ``p + 1`` keys of its own block table,
and all of a step's decodes have the same shape of problem, so one call can do them all, as vLLM's and
FlashInfer's decode kernels do (Kwon et al. 2023, arXiv:2309.06180, section 4.1; Ye et al. 2025,
arXiv:2501.01005). For request ``r`` with length ``n_r``, query heads ``h`` of KV head ``g(h)``::

    o[r, h] = softmax_j( q[r, h] . K_r[j, g(h)] / sqrt(d) ) V_r[j, g(h)],   j = 0 .. n_r - 1,

where ``K_r[j] = K_blocks[table_r[j // B], j % B]`` (block size ``B``). Two backends compute it:

- ``"torch"`` (:func:`paged_decode_reference`): gathers each request's blocks through the padded block
  tables, pads every request to the longest, and masks the padding with ``-inf`` before the softmax: the
  same products and sums as the per-request loop, so in float64 it equals the loop to rounding.
- ``"triton"``: :func:`utils.kernels.split_kv_decode.split_kv_decode` (Flash-Decoding with GQA packing)
  reads the engine's per-layer pools ``(num_blocks, block_size, n_kv_heads, head_dim)`` in place through
  the int32 block tables (no copy of the cache), with the split count of
  :func:`~utils.kernels.split_kv_decode.choose_num_splits`.

``"batched"`` picks ``"triton"`` where it runs compiled (a CUDA cache in fp16, bf16 or fp32 with the
model's dtype, power-of-two head size >= 16 and block size) and ``"torch"`` elsewhere.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch

from utils import device as dev
from utils.kernels.split_kv_decode import CPU_STAND_IN_SMS, check_decode_inputs, choose_num_splits, split_kv_decode

__all__ = ["BACKENDS", "DecodeBatch", "paged_decode_reference", "triton_can_run"]

BACKENDS = ("batched", "torch", "triton")
"""What :class:`DecodeBatch` accepts: ``"batched"`` chooses, the other two force a backend."""
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def paged_decode_reference(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor,
                           tables: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """One query per request over its paged keys and values, in PyTorch: ``(n, n_heads, head_dim)``.

    ``q``: ``(n, n_heads, head_dim)``; pools ``(num_blocks, block_size, n_kv_heads, head_dim)`` (cast to
    ``q``'s dtype); ``tables``: ``(n, width)`` block numbers, padded with any valid block; ``lengths``:
    ``(n,)``, each in ``1 .. width * block_size``. Keys at positions ``>= length`` are masked out.
    """
    n, n_heads, d, block_size, n_kv = check_decode_inputs(q, k_blocks, v_blocks, tables, lengths)
    width = tables.shape[1]
    idx = tables.long()
    keys = k_blocks[idx].reshape(n, width * block_size, n_kv, d).to(q.dtype).permute(0, 2, 3, 1)  # (n, g, d, S)
    values = v_blocks[idx].reshape(n, width * block_size, n_kv, d).to(q.dtype).transpose(1, 2)    # (n, g, S, d)
    group = n_heads // n_kv
    scores = q.view(n, n_kv, group, d) @ keys / math.sqrt(d)                                    # (n, g, group, S)
    padding = torch.arange(width * block_size, device=q.device)[None, :] >= lengths.to(q.device)[:, None]
    scores = scores.masked_fill(padding[:, None, None, :], float("-inf"))
    return (scores.softmax(-1) @ values).reshape(n, n_heads, d)


def triton_can_run(k_blocks: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether the compiled split-KV kernel can serve queries in ``dtype`` over pools like ``k_blocks``."""
    _, block_size, _, head_dim = k_blocks.shape
    return (dev.TRITON_ON_GPU and k_blocks.is_cuda and dtype == k_blocks.dtype and dtype in _TRITON_DTYPES
            and head_dim >= 16 and not head_dim & (head_dim - 1) and not block_size & (block_size - 1))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


class DecodeBatch:
    """The decode segments of one step, ready for one attention call per layer.

    Built once per step from each decode's ``block_table`` and ``length`` (its position + 1, the keys it
    attends to, itself included); :meth:`attend` is then called for each layer. ``rows`` are the decodes'
    rows in the step's flat token tensor (``None``: the step is all decodes, in order).
    """

    def __init__(self, block_tables: Sequence[Sequence[int]], lengths: Sequence[int], block_size: int,
                 device: torch.device | str, backend: str = "batched", rows: Sequence[int] | None = None) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if not block_tables or len(block_tables) != len(lengths):
            raise ValueError(f"need one block table per length and at least one; got {len(block_tables)} tables "
                             f"and {len(lengths)} lengths")
        width = max(-(-n // block_size) for n in lengths)
        if min(lengths) < 1 or any(len(t) < -(-n // block_size) for t, n in zip(block_tables, lengths)):
            raise ValueError(f"every length must be >= 1 and covered by its block table of {block_size}-token blocks")
        padded = [list(t[:width]) + [0] * (width - min(len(t), width)) for t in block_tables]
        self.tables = torch.tensor(padded, dtype=torch.int32).to(device)
        self.lengths = torch.tensor(list(lengths), dtype=torch.int32).to(device)
        self.max_len = max(lengths)
        self.backend = backend
        self.rows = None if rows is None else torch.tensor(list(rows), dtype=torch.long).to(device)
        self._splits: int | None = None

    def resolve(self, k_blocks: torch.Tensor, dtype: torch.dtype) -> str:
        """``"triton"`` or ``"torch"``: the backend :meth:`attend` uses for this cache and query dtype."""
        if self.backend == "batched":
            return "triton" if triton_can_run(k_blocks, dtype) else "torch"
        return self.backend

    def attend(self, q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor) -> torch.Tensor:
        """Attention of the decodes' queries ``(n, n_heads, head_dim)`` over one layer's pools."""
        if self.resolve(k_blocks, q.dtype) == "torch":
            return paged_decode_reference(q, k_blocks, v_blocks, self.tables, self.lengths)
        if self._splits is None:
            n_sms = _sm_count(q.device.index) if q.is_cuda and not dev.INTERPRETER else CPU_STAND_IN_SMS
            self._splits = choose_num_splits(q.shape[0], k_blocks.shape[2], self.max_len, n_sms, k_blocks.shape[1])
        return split_kv_decode(q, k_blocks, v_blocks, self.tables, self.lengths, self._splits)
