"""A paged KV cache: fixed-size blocks, a block table per sequence, and copy-on-write sharing.

Kwon et al., "Efficient Memory Management for Large Language Model Serving
with PagedAttention" (vLLM, SOSP 2023, arXiv:2309.06180), section 4: the cache
is one pool of ``num_blocks`` blocks of ``block_size`` tokens. A sequence owns
a *block table*, the list of its blocks in order, and grows one block at a
time, so at most ``block_size - 1`` slots of its last block are unused.
Forking a sequence (parallel sampling, beam search) shares every block and
copies nothing; each block keeps a reference count, and a write into a block
that more than one sequence uses first copies it (section 4.4).
"""

from __future__ import annotations

import copy

import torch

from utils.validate import check_positive_int


class OutOfBlocksError(RuntimeError):
    """The pool has fewer free blocks than an append needs; nothing was changed."""


class PagedKVCache:
    """Keys and values of many sequences in ``num_blocks`` blocks of ``block_size`` tokens each.

    ``k_blocks`` and ``v_blocks`` have shape
    ``(num_blocks, block_size, n_kv_heads, head_dim)``; token ``i`` of a
    sequence lives in block ``block_table(seq)[i // block_size]`` at slot
    ``i % block_size``.
    """

    def __init__(self, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        self.num_blocks = check_positive_int("num_blocks", num_blocks)
        self.block_size = check_positive_int("block_size", block_size)
        self.n_kv_heads = check_positive_int("n_kv_heads", n_kv_heads)
        self.head_dim = check_positive_int("head_dim", head_dim)
        shape = (num_blocks, block_size, n_kv_heads, head_dim)
        self.k_blocks = torch.zeros(shape, dtype=dtype, device=device)
        self.v_blocks = torch.zeros(shape, dtype=dtype, device=device)
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self._refcount = [0] * num_blocks
        self._tables: dict[int, list[int]] = {}
        self._lengths: dict[int, int] = {}
        self._next_id = 0
        self.copies = 0
        """Blocks copied so far by copy-on-write."""

    @property
    def num_free_blocks(self) -> int:
        """Blocks not used by any sequence."""
        return len(self._free)

    def _check_seq(self, seq_id: int) -> None:
        if seq_id not in self._tables:
            raise ValueError(f"no sequence {seq_id!r} in this cache; live sequences: {sorted(self._tables)}")

    def add_sequence(self) -> int:
        """Start an empty sequence (no blocks yet) and return its id."""
        seq_id = self._next_id
        self._next_id += 1
        self._tables[seq_id], self._lengths[seq_id] = [], 0
        return seq_id

    def block_table(self, seq_id: int) -> list[int]:
        """The blocks of ``seq_id`` in token order (a copy)."""
        self._check_seq(seq_id)
        return list(self._tables[seq_id])

    def length(self, seq_id: int) -> int:
        """Tokens stored for ``seq_id``."""
        self._check_seq(seq_id)
        return self._lengths[seq_id]

    def refcount(self, block: int) -> int:
        """How many sequences use ``block``."""
        return self._refcount[block]

    def _allocate(self) -> int:
        block = self._free.pop()
        self._refcount[block] = 1
        return block

    def _release(self, block: int) -> None:
        self._refcount[block] -= 1
        if self._refcount[block] == 0:
            self._free.append(block)

    def append(self, seq_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``n_tokens`` more keys and values, each of shape ``(n_tokens, n_kv_heads, head_dim)``.

        New blocks are taken as needed. If the last block is shared and has
        free slots, it is copied first (copy-on-write). If the pool cannot
        supply every block this append needs, :class:`OutOfBlocksError` is
        raised before anything is written.
        """
        self._check_seq(seq_id)
        expected = (self.n_kv_heads, self.head_dim)
        if k.dim() != 3 or v.shape != k.shape or tuple(k.shape[1:]) != expected:
            raise ValueError(f"k and v must both have shape (n_tokens, {self.n_kv_heads}, {self.head_dim}); "
                             f"got {tuple(k.shape)} and {tuple(v.shape)}")
        n_new = k.shape[0]
        if n_new == 0:
            return
        table, length = self._tables[seq_id], self._lengths[seq_id]
        room_in_last = (-length) % self.block_size
        shared_tail = room_in_last > 0 and self._refcount[table[-1]] > 1
        needed = -(-(n_new - room_in_last) // self.block_size) if n_new > room_in_last else 0
        needed += int(shared_tail)
        if needed > self.num_free_blocks:
            raise OutOfBlocksError(f"appending {n_new} tokens to sequence {seq_id} needs {needed} free blocks, "
                                   f"but only {self.num_free_blocks} of {self.num_blocks} are free; "
                                   "free a sequence or make the cache larger")
        if shared_tail:
            old, new = table[-1], self._allocate()
            self.k_blocks[new].copy_(self.k_blocks[old])
            self.v_blocks[new].copy_(self.v_blocks[old])
            self._release(old)
            table[-1] = new
            self.copies += 1
        written = 0
        while written < n_new:
            slot = (length + written) % self.block_size
            if slot == 0:
                table.append(self._allocate())
            take = min(self.block_size - slot, n_new - written)
            block = table[-1]
            self.k_blocks[block, slot:slot + take] = k[written:written + take]
            self.v_blocks[block, slot:slot + take] = v[written:written + take]
            written += take
        self._lengths[seq_id] = length + n_new

    def to(self, device: torch.device | str) -> "PagedKVCache":
        """A copy of this cache (blocks, tables, reference counts) with its block pools on ``device``."""
        other = copy.copy(self)
        other.k_blocks, other.v_blocks = self.k_blocks.to(device, copy=True), self.v_blocks.to(device, copy=True)
        other._free, other._refcount = list(self._free), list(self._refcount)
        other._tables = {seq: list(table) for seq, table in self._tables.items()}
        other._lengths = dict(self._lengths)
        return other

    def fork(self, seq_id: int) -> int:
        """A new sequence that shares every block of ``seq_id``: no copy, reference counts + 1."""
        self._check_seq(seq_id)
        child = self.add_sequence()
        self._tables[child] = list(self._tables[seq_id])
        self._lengths[child] = self._lengths[seq_id]
        for block in self._tables[child]:
            self._refcount[block] += 1
        return child

    def gather(self, seq_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``seq_id`` as contiguous ``(n_tokens, n_kv_heads, head_dim)`` tensors."""
        self._check_seq(seq_id)
        table, length = self._tables[seq_id], self._lengths[seq_id]
        index = torch.tensor(table, dtype=torch.long, device=self.k_blocks.device)
        k = self.k_blocks[index].flatten(0, 1)[:length]
        v = self.v_blocks[index].flatten(0, 1)[:length]
        return k, v

    def free(self, seq_id: int) -> None:
        """Forget ``seq_id``; blocks no other sequence uses go back to the pool."""
        self._check_seq(seq_id)
        for block in self._tables.pop(seq_id):
            self._release(block)
        del self._lengths[seq_id]


def interleaved_cache(k: torch.Tensor, v: torch.Tensor, block_size: int) -> tuple[PagedKVCache, list[int]]:
    """A cache holding ``k`` and ``v`` of ``(n_seqs, n_tokens, n_kv_heads, head_dim)``, filled as concurrent
    decoding fills it: one block of ``block_size`` tokens per sequence in turn, round-robin.

    So sequence ``s`` of ``n`` gets the physical blocks ``s, s + n, s + 2n, ...``: its keys and values are
    scattered through the pool, as in a serving engine, and nothing in the layout helps a kernel that reads
    them through the block tables. Returns the cache (on ``k``'s device and dtype) and the sequence ids.
    """
    if k.dim() != 4 or v.shape != k.shape:
        raise ValueError(f"k and v must both be (n_seqs, n_tokens, n_kv_heads, head_dim); got {tuple(k.shape)} "
                         f"and {tuple(v.shape)}")
    n_seqs, n_tokens, n_kv_heads, head_dim = k.shape
    check_positive_int("block_size", block_size)
    blocks_per_seq = -(-n_tokens // block_size)
    cache = PagedKVCache(max(1, n_seqs * blocks_per_seq), block_size, n_kv_heads, head_dim, k.dtype, k.device)
    seqs = [cache.add_sequence() for _ in range(n_seqs)]
    for start in range(0, n_tokens, block_size):
        for s, seq in enumerate(seqs):
            cache.append(seq, k[s, start:start + block_size], v[s, start:start + block_size])
    return cache, seqs
