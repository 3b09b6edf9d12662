"""Bandwidth figures and conversions: link rates in Gb/s, and nccl-tests' algorithm and bus bandwidth.

Vendors quote links in Gb/s (10^9 bits per second, one direction); the cost
models of :mod:`utils.parallel.comm.network` take bytes/s
(:func:`gbit_per_s_to_bytes_per_s`). A measured collective is reported as
nccl-tests reports it (NVIDIA nccl-tests, doc/PERFORMANCE.md): the algorithm
bandwidth ``algbw = S / t`` and the bus bandwidth ``busbw = algbw * factor``,
the factor chosen so that busbw is what each rank's link sustained, whatever
the number of ranks (:func:`bus_bandwidth_factor`).
"""

from __future__ import annotations

from utils.validate import check_nonnegative, check_positive, check_positive_int


def gbit_per_s_to_bytes_per_s(gbit_per_s: float) -> float:
    """Convert a link rate in Gb/s (10^9 bits per second) to bytes/s: ``gbit_per_s * 1e9 / 8``."""
    check_nonnegative("gbit_per_s", gbit_per_s)
    return gbit_per_s * 1e9 / 8


COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")
"""Collectives that nccl-tests reports a bus bandwidth for (NCCL's five, plus all-to-all)."""


def bus_bandwidth_factor(collective: str, n: int) -> float:
    """busbw / algbw for ``collective`` on ``n`` ranks, as nccl-tests computes it.

    NVIDIA nccl-tests, doc/PERFORMANCE.md, "Summary": all-reduce ``2(n-1)/n``;
    reduce-scatter, all-gather and all-to-all ``(n-1)/n``; broadcast and reduce
    ``1``. The factor turns the algorithm bandwidth into the bandwidth each
    rank's link sustained, which can be compared with the hardware's peak
    whatever ``n`` is.
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; allowed: {', '.join(COLLECTIVES)}")
    check_positive_int("n (the number of ranks)", n)
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return 1.0


def algorithm_bandwidth(nbytes: float, seconds: float) -> float:
    """algbw = ``nbytes / seconds`` in bytes/s (nccl-tests, doc/PERFORMANCE.md).

    ``nbytes`` is the size S of the operation: the buffer of an all-reduce,
    broadcast or reduce; the *whole* gathered (or scattered) array of an
    all-gather or reduce-scatter, that is ``n`` times each rank's piece.
    """
    check_nonnegative("nbytes", nbytes)
    check_positive("seconds", seconds)
    return nbytes / seconds


def bus_bandwidth(collective: str, algbw: float, n: int) -> float:
    """busbw = ``algbw * bus_bandwidth_factor(collective, n)`` in the unit of ``algbw`` (nccl-tests)."""
    check_nonnegative("algbw", algbw)
    return algbw * bus_bandwidth_factor(collective, n)


def allreduce_bus_bandwidth(algbw: float, n: int) -> float:
    """All-reduce bus bandwidth: ``algbw * 2(n-1)/n`` (nccl-tests, doc/PERFORMANCE.md)."""
    return bus_bandwidth("all_reduce", algbw, n)
