"""Shared-memory banks: which bank each thread of a warp hits, and how many ways a request conflicts.

Shared memory is divided into 32 banks; "successive 32-bit words map to
successive banks" and each bank delivers one 32-bit word per clock (CUDA C++
Programming Guide, shared memory of compute capability 5.x and later; CUDA C++
Best Practices Guide, "Shared Memory and Memory Banks"). So the bank of a byte
address ``a`` is

    bank(a) = (a // 4) mod 32.

When the threads of a warp ask for ``n`` *different* words that live in the same
bank, the request is split into ``n`` conflict-free requests that are served one
after the other (an ``n``-way bank conflict, ``n`` wavefronts instead of one).
Threads that ask for the *same* word do not conflict: the word is read once and
broadcast (multicast) to all of them. :func:`bank_conflict_ways` counts exactly
this: the largest number of distinct words any one bank is asked for.

The two cures for a strided pattern, both of which :func:`tile_word_address`
models for a tile stored row by row:

- **padding**: store each row of a 32-float tile with a pitch of 33 words, so
  that element ``(r, c)`` lives in bank ``(33 r + c) mod 32 = (r + c) mod 32``
  and a column is spread over all 32 banks;
- **XOR swizzling**: keep the pitch at 32 but store column ``c`` of row ``r``
  at column ``c XOR (r mod 32)``; rows and columns both hit 32 different banks,
  and no memory is wasted. Tensor-core kernels (CUTLASS, Triton's compiler)
  use swizzled layouts of this kind, on 16-byte chunks rather than single words.

The sizes come from :mod:`utils.gpu.memory_hierarchy` (``SHARED_MEMORY_BANKS``,
``SHARED_MEMORY_BANK_BYTES_PER_CLOCK``). Used by
``chapters/01-gpu-architecture/03-memory-hierarchy``.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from utils.gpu.hardware import WARP_SIZE
from utils.gpu.memory_hierarchy import SHARED_MEMORY_BANK_BYTES_PER_CLOCK as BANK_BYTES
from utils.gpu.memory_hierarchy import SHARED_MEMORY_BANKS as BANKS
from utils.validate import check_nonnegative_int, check_positive_int

__all__ = ["BANKS", "BANK_BYTES", "bank_of_word", "warp_banks", "bank_conflict_ways", "tile_word_address"]


def bank_of_word(word_address: int) -> int:
    """The bank of a 4-byte word: ``word_address mod 32`` (a byte address ``a`` is word ``a // 4``)."""
    check_nonnegative_int("word_address", word_address)
    return word_address % BANKS


def _check_warp(word_addresses: Sequence[int]) -> list[int]:
    words = list(word_addresses)
    if not 1 <= len(words) <= WARP_SIZE:
        raise ValueError(f"a warp's request has 1..{WARP_SIZE} word addresses (one per active thread), "
                         f"got {len(words)}")
    for w in words:
        check_nonnegative_int("word address", w)
    return words


def warp_banks(word_addresses: Sequence[int]) -> list[int]:
    """The bank each thread of one warp request hits, in thread order."""
    return [bank_of_word(w) for w in _check_warp(word_addresses)]


def bank_conflict_ways(word_addresses: Sequence[int]) -> int:
    """How many serialised requests (wavefronts) one warp's shared-memory access of 4-byte words needs.

    ``max over banks b of |{distinct words w in the request : w mod 32 = b}|``. Threads reading
    the same word count once (broadcast), so a request where every thread reads one word is
    1-way. ``word_addresses`` holds one 4-byte-word address per active thread (1 to 32 of them).
    """
    words = set(_check_warp(word_addresses))
    return max(Counter(w % BANKS for w in words).values())


def tile_word_address(row: int, col: int, row_pitch_words: int = BANKS, xor_swizzle: bool = False) -> int:
    """Word address of element ``(row, col)`` of a 4-byte-element tile stored row by row.

    ``row * row_pitch_words + col``; with ``xor_swizzle`` the column is stored at
    ``col XOR (row mod 32)`` instead (which needs ``row_pitch_words`` to be a multiple of 32,
    so that the swizzled column stays inside its row). A pitch of 33 for a 32-wide tile is
    the padded layout.
    """
    check_nonnegative_int("row", row)
    check_nonnegative_int("col", col)
    check_positive_int("row_pitch_words", row_pitch_words)
    if col >= row_pitch_words:
        raise ValueError(f"col must be below the row pitch {row_pitch_words}, got {col}")
    if xor_swizzle:
        if row_pitch_words % BANKS:
            raise ValueError(f"an XOR swizzle over {BANKS} banks needs a row pitch that is a multiple of {BANKS} "
                             f"words, got {row_pitch_words}")
        col = (col & ~(BANKS - 1)) | ((col % BANKS) ^ (row % BANKS))
    return row * row_pitch_words + col
