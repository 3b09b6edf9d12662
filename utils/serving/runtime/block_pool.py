"""The block pool of a serving engine: reference-counted KV blocks, and prefix caching with LRU eviction.

This is the bookkeeping half of vLLM's KV-cache manager (Kwon et al. 2023,
arXiv:2309.06180; the v1 engine's ``BlockPool`` and automatic prefix caching):
no tensors, only which block holds what.

- A request holds a list of blocks. Each block has a reference count: the
  number of requests whose block table contains it.
- With prefix caching, a block that has been filled completely is
  registered under its chained hash (:func:`utils.serving.runtime.prefix_hash.block_hashes`),
  which names the whole prefix up to the block's end. A new request first
  looks its full prompt blocks up by hash and reuses the longest run of hits:
  their keys and values are not recomputed.
- When a block's count falls to 0 it goes to the *free queue*, but keeps its
  contents and hash: it stays a cache hit until it is reused for something
  else. Allocation takes the block at the head of the queue, the least
  recently freed, and drops its hash then (LRU eviction). A request frees its
  blocks last-to-first, so a prefix's tail is evicted before its head, which
  more requests are likely to share.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from utils.serving.runtime.prefix_hash import BlockHash
from utils.validate import check_positive_int

__all__ = ["BlockPool"]


class BlockPool:
    """``num_blocks`` KV blocks: allocate, share, free, and (with ``prefix_caching``) find by prefix hash."""

    def __init__(self, num_blocks: int, prefix_caching: bool = False) -> None:
        self.num_blocks = check_positive_int("num_blocks", num_blocks)
        self.prefix_caching = bool(prefix_caching)
        self._refcount = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self._hash_of: dict[int, BlockHash] = {}
        self._block_of: dict[BlockHash, int] = {}
        self.evictions = 0
        """Cached blocks whose contents were dropped to make room."""

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds: empty ones and cached ones that allocation may evict."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered under a prefix hash (held or free)."""
        return len(self._block_of)

    def refcount(self, block: int) -> int:
        return self._refcount[block]

    def allocate(self, n: int) -> list[int]:
        """``n`` blocks with count 1, least recently freed first; a cached block taken loses its hash."""
        if n < 0 or n > self.num_free_blocks:
            raise ValueError(f"cannot allocate {n} blocks: {self.num_free_blocks} of {self.num_blocks} are free")
        blocks = []
        for _ in range(n):
            block, _ = self._free.popitem(last=False)
            if block in self._hash_of:
                del self._block_of[self._hash_of.pop(block)]
                self.evictions += 1
            self._refcount[block] = 1
            blocks.append(block)
        return blocks

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each block, last to first; blocks nobody holds join the free queue's tail."""
        for block in reversed(blocks):
            if self._refcount[block] <= 0:
                raise ValueError(f"block {block} is not held by any request")
            self._refcount[block] -= 1
            if self._refcount[block] == 0:
                self._free[block] = None

    def lookup(self, hashes: Sequence[BlockHash]) -> list[int]:
        """The cached blocks of the longest prefix of ``hashes`` found, each now held once more (a hit).

        Nothing is found without prefix caching. A hit on a free block takes it off the free queue.
        """
        found = []
        if not self.prefix_caching:
            return found
        for h in hashes:
            block = self._block_of.get(h)
            if block is None:
                break
            found.append(block)
        for block in found:
            if self._refcount[block] == 0:
                del self._free[block]
            self._refcount[block] += 1
        return found

    def register(self, block: int, block_hash: BlockHash) -> None:
        """Record that held ``block`` is full and holds the prefix named ``block_hash``.

        If another block already holds that prefix (two requests computed it at once), the first stays
        the one found; ``block`` is then an uncached duplicate, freed normally.
        """
        if not self.prefix_caching:
            return
        if self._refcount[block] <= 0:
            raise ValueError(f"block {block} is not held by any request and cannot be registered")
        if block_hash in self._block_of or block in self._hash_of:
            return
        self._hash_of[block] = block_hash
        self._block_of[block_hash] = block

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (after a weight update their keys and values are stale); returns how many.

        Only when no request holds a block: a running request's blocks would otherwise stay shared under
        hashes that no longer name what the new weights compute (vLLM's ``reset_prefix_cache`` refuses too).
        """
        held = sum(1 for c in self._refcount if c > 0)
        if held:
            raise ValueError(f"{held} blocks are still held by requests: finish them before resetting the cache")
        n = len(self._block_of)
        self._hash_of.clear()
        self._block_of.clear()
        return n

    def cached_hashes(self) -> set[BlockHash]:
        """The prefix hashes a lookup can hit now."""
        return set(self._block_of)
