"""Chained block hashes: the key under which a serving engine finds a cached prefix.

vLLM's automatic prefix caching (docs, "Automatic Prefix Caching", design)
names each *full* block of a sequence's KV cache by a hash of the block's own
tokens and the hash of the block before it:

``h_0 = H(root, salt, tokens[0:B])``, ``h_j = H(h_{j-1}, tokens[jB:(j+1)B])``

so ``h_j`` names the whole prefix ``tokens[0:(j+1)B]``, not only block ``j``:
two sequences share block ``j``'s keys and values when they share every token
up to its end (keys and values depend on every earlier token). A partial last
block has no hash and is never shared.

Equal hashes mean equal prefixes only up to a collision, and the engine never
compares tokens on a hit, so the hash must make collisions impossible to find:

* ``algorithm="sha256"`` (the default, as in vLLM since v0.10.2; an option since
  v0.8.3, vLLM PR #15297): SHA-256 over an unambiguous byte encoding (the
  parent's 32-byte digest, the salt with its length, then each token as a signed
  64-bit little-endian integer). No one knows how to build two prefixes with the
  same digest, by design of the hash.
* ``algorithm="builtin"``: Python's ``hash`` of the tuple ``(parent, tokens)``,
  vLLM's first scheme. It is 64 bits wide and not built to resist a search; from
  Python 3.12 ``hash(None)``, vLLM's root, was a constant, which let anyone
  predict the chain and plan a collision with another tenant's prompt (vLLM PR
  #12621, advisory GHSA-rm76-4mrf-v9r8). Kept to teach that lesson.

``salt`` (vLLM's per-request ``cache_salt``) is mixed into the first block only,
and through the chain into every later one: requests share cached blocks only
when they share the salt. One salt per tenant stops one tenant from timing
another's cache hits to learn its prompts (vLLM docs, "Cache Isolation for
Security"; Song et al., "The Early Bird Catches the Leak", arXiv:2409.20002).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from utils.validate import check_positive_int

__all__ = ["ALGORITHMS", "BlockHash", "ROOT_HASH", "block_hashes"]

BlockHash = bytes
"""A block's chained hash: a 32-byte SHA-256 digest (8 bytes under ``"builtin"``)."""

ROOT_HASH: BlockHash = b""
"""The parent hash of a sequence's first block."""

ALGORITHMS = ("sha256", "builtin")


def block_hashes(tokens: Sequence[int], block_size: int, parent: BlockHash = ROOT_HASH, *,
                 salt: str | None = None, algorithm: str = "sha256") -> list[BlockHash]:
    """The chained hash of each full block of ``tokens``: ``len(tokens) // block_size`` hashes.

    ``parent`` is the hash of the block before ``tokens[0]`` (:data:`ROOT_HASH` at a sequence's start), so
    the hashes of a sequence can be extended block by block as it grows. ``salt`` enters the first block's
    hash (``parent`` is :data:`ROOT_HASH`); given with any other parent it is refused, since the chain
    already carries it. ``algorithm`` is one of :data:`ALGORITHMS` (see the module docstring).
    """
    check_positive_int("block_size", block_size)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if not isinstance(parent, bytes):
        raise ValueError(f"parent must be a block hash (bytes, ROOT_HASH at a sequence's start), got "
                         f"{type(parent).__name__}")
    if salt is not None and parent != ROOT_HASH:
        raise ValueError("salt enters the first block's hash only: give it with parent=ROOT_HASH, not when "
                         "extending a chain (its hashes already carry it)")
    hashes, h = [], parent
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = [int(t) for t in tokens[start:start + block_size]]
        first_salt = salt if h == ROOT_HASH else None
        h = _sha256(h, first_salt, block) if algorithm == "sha256" else _builtin(h, first_salt, block)
        hashes.append(h)
    return hashes


def _sha256(parent: BlockHash, salt: str | None, block: list[int]) -> BlockHash:
    digest = hashlib.sha256(parent)
    salt_bytes = b"" if salt is None else salt.encode()
    # the salt's length (and whether there is one) first, so that no salt and token bytes can run together
    digest.update(struct.pack("<bq", salt is not None, len(salt_bytes)) + salt_bytes)
    digest.update(struct.pack(f"<{len(block)}q", *block))
    return digest.digest()


def _builtin(parent: BlockHash, salt: str | None, block: list[int]) -> BlockHash:
    # the root is 0, not None (hash(None) differs from process to process before Python 3.12); a salt's
    # hash does too (string hashing is seeded per process), so salted builtin hashes hold in one process only
    value = hash((int.from_bytes(parent, "little", signed=True) if parent else 0, salt, tuple(block)))
    return value.to_bytes(8, "little", signed=True)
