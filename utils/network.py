"""Cost models of collective communication: how long an all-reduce takes.

The alpha-beta model prices one message of ``n`` bytes over a link as
``alpha + n / B``: a fixed latency ``alpha`` (seconds) plus the bytes over the
bandwidth ``B`` (bytes/s). Collective algorithms are priced by counting their
steps and the bytes each step sends (Thakur, Rabenseifner and Gropp,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 2005).
"""

from __future__ import annotations


def _check_collective_args(n: int, nbytes: float, bandwidth: float, latency: float) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n (the number of GPUs) must be a positive int, got {n!r}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
    if latency < 0:
        raise ValueError(f"latency must be >= 0 seconds, got {latency}")


def ring_allreduce_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` per GPU over ``n`` GPUs.

    ``2(n-1) * latency + 2(n-1)/n * nbytes / bandwidth``: a reduce-scatter and an
    all-gather, each ``n - 1`` steps that send one ``nbytes / n`` chunk
    (Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters
    of workstations", JPDC 2009). ``bandwidth`` is each GPU's send bandwidth in
    bytes/s, ``latency`` the per-step latency in seconds. One GPU needs no time.
    """
    _check_collective_args(n, nbytes, bandwidth, latency)
    if n == 1:
        return 0.0
    return 2 * (n - 1) * latency + 2 * (n - 1) / n * nbytes / bandwidth
