"""How a FlashAttention kernel lays out its work: tile shapes, causal tiles, program order, GQA packing.

Three pieces of engineering sit on top of the algorithm of
:mod:`utils.attention.flash_reference`, and each is a count that does not need
a GPU (the chapter ``chapters/03-attention/05-flash-attention`` uses them):

- :func:`causal_tile_counts`: with a causal mask a row tile visits the key tiles
  up to the diagonal. Those wholly left of it need no mask; only the ones that
  cross it do. Triton's fused-attention tutorial
  (triton-lang/triton, ``python/tutorials/06-fused-attention.py``) runs the two
  kinds in separate loops, as :func:`utils.kernels.flash_attention.flash_attention`
  does (``split_diagonal=True``).
- :func:`list_schedule_makespan`: causal row tiles have unequal work (tile ``i``
  visits ``i + 1`` key tiles). A GPU hands programs to free SMs in grid order,
  so the order decides how long the last SM runs: heavy tiles first (longest
  processing time first, Graham 1969) leaves short ones to fill the tail.
- :func:`recorded_tile_sweep`: the tile shapes ``python -m benchmarks.flash_tiles``
  measured on a GPU (``benchmarks/results/flash_tiles-<gpu>.txt``), fastest first.
- :func:`gqa_kv_tile_loads`: under grouped-query attention ``g`` query heads
  share one K/V head. One program per query head loads every K/V tile ``g``
  times; one program that packs the group's query rows loads it once.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from utils.validate import check_positive_int


class CausalTiles(NamedTuple):
    """Key tiles visited by the row tiles of one causal head: unmasked, masked (crossing the diagonal), skipped."""

    unmasked: int
    masked: int
    skipped: int
    useful_scores: int
    computed_scores: int

    @property
    def visited(self) -> int:
        return self.unmasked + self.masked


def causal_tile_counts(seq_len: int, block_m: int, block_n: int) -> CausalTiles:
    """Tiles of one head's causal forward with ``block_m`` query rows and ``block_n`` keys per tile.

    Row tile ``i`` covers rows ``[i B_m, (i+1) B_m)``; it visits key tiles up
    to ``min((i+1) B_m, N)``. A key tile ending at or before ``i B_m`` is wholly
    visible (no mask); one that crosses the diagonal is masked; the rest are
    never loaded. ``useful_scores`` is ``N (N + 1) / 2``, the entries the mask
    keeps; ``computed_scores`` counts every entry of every visited tile (tails
    clipped to ``N``), so their difference is the work wasted on the diagonal.
    """
    n = check_positive_int("seq_len", seq_len)
    bm = check_positive_int("block_m", block_m)
    bn = check_positive_int("block_n", block_n)
    n_key_tiles = math.ceil(n / bn)
    unmasked = masked = computed = 0
    for i in range(math.ceil(n / bm)):
        row0, row1 = i * bm, min((i + 1) * bm, n)
        clear = row0 // bn  # key tiles ending at or before row0
        crossing = math.ceil(row1 / bn) - clear
        unmasked += clear
        masked += crossing
        computed += (row1 - row0) * min(math.ceil(row1 / bn) * bn, n)
    total = math.ceil(n / bm) * n_key_tiles
    return CausalTiles(unmasked, masked, total - unmasked - masked, n * (n + 1) // 2, computed)


def list_schedule_makespan(work: Sequence[float], n_workers: int) -> float:
    """Finish time when jobs ``work`` start in the given order, each on the first worker to become free.

    This is how a GPU's block scheduler hands out a grid's programs to SMs
    (one program per SM at a time here). Sorting ``work`` heaviest first is
    Graham's LPT rule (1969): its makespan is at most ``4/3 - 1/(3m)`` of the
    optimum on ``m`` workers.
    """
    m = check_positive_int("n_workers", n_workers)
    if not work or any(w < 0 for w in work):
        raise ValueError("work must be a non-empty sequence of non-negative durations")
    free = [0.0] * m
    for w in work:
        heapq.heapreplace(free, free[0] + w)
    return max(free)


def causal_row_tile_work(seq_len: int, block_m: int, block_n: int, heads: int) -> list[int]:
    """Key tiles visited by each causal program, in grid order: row tiles of head 0, then head 1, ...."""
    n = check_positive_int("seq_len", seq_len)
    bm = check_positive_int("block_m", block_m)
    bn = check_positive_int("block_n", block_n)
    check_positive_int("heads", heads)
    per_head = [math.ceil(min((i + 1) * bm, n) / bn) for i in range(math.ceil(n / bm))]
    return per_head * heads


def gqa_kv_tile_loads(seq_len: int, head_dim: int, q_heads: int, kv_heads: int, block_m: int,
                      element_size: int = 2, packed: bool = False, kv_len: int | None = None) -> float:
    """Bytes of K and V that one sequence's programs load into SMs (non-causal forward), with GQA.

    ``seq_len`` query rows attend to ``kv_len`` keys (``seq_len`` by default;
    one query row and a long ``kv_len`` is decoding). Unpacked, each of
    ``q_heads`` heads has ``ceil(seq_len / B_m)`` programs, each of which loads
    all of its K/V head: ``q_heads * T_r * 2 kv_len d`` elements. Packed, one
    program takes ``B_m`` rows of all ``g = q_heads / kv_heads`` query heads of a
    group (a ``g B_m``-row tile against the shared K/V tile), so each K/V tile is
    loaded ``g`` times fewer: ``kv_heads * T_r * 2 kv_len d``. With L2 reuse HBM
    may see K/V once either way; the packing saves L2-to-SM traffic and shared
    memory loads, and in decoding, where nothing else reuses the cache, it turns
    ``g`` reads of it into one.
    """
    n = check_positive_int("seq_len", seq_len)
    d = check_positive_int("head_dim", head_dim)
    hq = check_positive_int("q_heads", q_heads)
    hkv = check_positive_int("kv_heads", kv_heads)
    bm = check_positive_int("block_m", block_m)
    n_kv = n if kv_len is None else check_positive_int("kv_len", kv_len)
    if hq % hkv:
        raise ValueError(f"q_heads must be a multiple of kv_heads, got {hq} and {hkv}")
    programs = (hkv if packed else hq) * math.ceil(n / bm)
    return float(programs * 2 * n_kv * d * element_size)


class TileRate(NamedTuple):
    """One configuration of the recorded tile sweep: TFLOP/s and its tiles, warps and pipeline stages."""

    tflops: float
    block_m: int
    block_n: int
    warps: int
    stages: int


_SWEEP_LINE = re.compile(r"^\s+(\d+) TFLOP/s .*BLOCK_M\s+(\d+)\s+BLOCK_N\s+(\d+)\s+(\d+) warps\s+(\d+) stages")
_SWEEP_HEADER = re.compile(r"^n=(\d+): SDPA cuDNN (\d+) TFLOP/s; default tiles (\d+)")


def recorded_tile_sweep(gpu: str = "h100-sxm") -> dict[int, dict]:
    """``benchmarks/results/flash_tiles-<gpu>.txt`` as ``{N: {"cudnn": .., "default": .., "configs": [TileRate]}}``.

    The file is written by ``python -m benchmarks.flash_tiles`` on a GPU (its
    header names the device, date and versions); configurations are listed
    fastest first, as recorded. The default tiles of
    :func:`utils.kernels.flash_attention.flash_attention` are 64 x 64, 4 warps, 3 stages.
    """
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / f"flash_tiles-{gpu}.txt"
    if not path.exists():
        raise ValueError(f"no tile sweep recorded for {gpu!r} (looked for {path})")
    sweep: dict[int, dict] = {}
    current = None
    for line in path.read_text().splitlines():
        if (header := _SWEEP_HEADER.match(line)):
            current = sweep.setdefault(int(header[1]), {"cudnn": float(header[2]), "default": float(header[3]),
                                                         "configs": []})
        elif (row := _SWEEP_LINE.match(line)) and current is not None:
            current["configs"].append(TileRate(float(row[1]), *(int(row[i]) for i in range(2, 6))))
    return sweep
