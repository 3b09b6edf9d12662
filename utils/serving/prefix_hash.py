"""Chained block hashes: the key under which a serving engine finds a cached prefix.

vLLM's automatic prefix caching (docs, "Automatic Prefix Caching", design)
names each *full* block of a sequence's KV cache by a hash of the block's own
tokens and the hash of the block before it:

``h_0 = hash((root, tokens[0:B]))``, ``h_j = hash((h_{j-1}, tokens[jB:(j+1)B]))``

so ``h_j`` identifies the whole prefix ``tokens[0:(j+1)B]``, not only block
``j``: two sequences share block ``j``'s keys and values exactly when they share
every token up to its end (keys and values depend on every earlier token). A
partial last block has no hash and is never shared. Python's ``hash`` of a
tuple of ints is deterministic across processes (no string hashing is
involved), which the tests rely on.
"""

from __future__ import annotations

from collections.abc import Sequence

from utils.validate import check_positive_int

__all__ = ["ROOT_HASH", "block_hashes"]

ROOT_HASH = 0
"""The parent hash of a sequence's first block."""


def block_hashes(tokens: Sequence[int], block_size: int, parent: int = ROOT_HASH) -> list[int]:
    """The chained hash of each full block of ``tokens``: ``len(tokens) // block_size`` hashes.

    ``parent`` is the hash of the block before ``tokens[0]`` (:data:`ROOT_HASH` at a sequence's start), so
    the hashes of a sequence can be extended block by block as it grows.
    """
    check_positive_int("block_size", block_size)
    hashes, h = [], parent
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hash((h, tuple(int(t) for t in tokens[start:start + block_size])))
        hashes.append(h)
    return hashes
