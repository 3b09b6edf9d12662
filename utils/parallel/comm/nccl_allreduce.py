"""What NCCL reaches: an all-reduce inside one NVLink domain, calibrated on published nccl-tests figures.

The models of :mod:`utils.parallel.comm.network` are ideal: every byte at the
link's line rate, one small latency per step. They are bounds, and the
planner prices its rings with them. Measured all-reduces fall short of them
in three ways, and :func:`nccl_allreduce_time` puts each back:

1. **Link efficiency.** NCCL's rings reach about 80 % of NVLink's line rate
   ("450GB/s is the line rate. With the protocol overhead (~20%) NCCL can get
   an effective NVLink bandwidth of 370GB/s": S. Jeaugey, NCCL maintainer,
   NVIDIA/nccl-tests issue 212, 2024-05-06). :data:`RING_LINK_EFFICIENCY` is
   that ratio, fitted on H100 alone.
2. **NVLink SHARP moves more than the buffer.** NCCL's NVLS all-reduce is a
   switch reduce-scatter (``multimem.ld_reduce``) then a switch all-gather
   (``multimem.st``): each GPU sends ``M`` (its share of every reduction) plus
   ``M/n`` (its reduced shard) and receives as much, ``(n+1)/n * M`` each way,
   not ``M``. Jeaugey gives the busbw NCCL reaches with it on 8 H100s: "a
   peak busBw of ~480GB/s (algbw ~275GB/s)" (same thread), not the
   ``2(n-1)/n * 450 = 787`` GB/s of the ideal model; the ratio of the two is
   :data:`NVLS_LINK_EFFICIENCY`, fitted on that one figure.
3. **A fixed cost per call.** Launch, synchronisation and the protocol's
   first chunk cost tens of microseconds, whatever the size: a 32 KiB
   all-reduce on 8 A100s took 43.8 us in stas00's nccl-tests sweep (the fit
   row of :data:`ALLREDUCE_BASE_LATENCY_S`), against the ideal ring's
   ``14 * 2 us``. NCCL's own tuning model has the same shape, a base latency
   per algorithm and protocol plus a small one per step (NVIDIA/nccl,
   ``src/graph/tuning.cc``, ``baseLat`` and ``hwLat``). The alpha-beta form
   ``latency + bytes / bandwidth`` then gives the ramp below the plateau.

Left out: NCCL's choice of protocol (LL, LL128, Simple) and of channel count
by size, which make the mid-size ramp of some sweeps slower than one latency
explains (the A100 sweep at 1-16 MiB); trees; multi-node rings.
"""

from __future__ import annotations

from utils.parallel.comm.bandwidth import bus_bandwidth_factor
from utils.validate import check_nonnegative, check_positive, check_positive_int

ALGORITHMS = ("ring", "nvls")
"""The NCCL all-reduce algorithms priced here: ``"ring"`` and ``"nvls"`` (NVLink SHARP)."""

H100_NVLINK_ONE_WAY_BYTES_PER_S = 450e9
"""NVLink 4 of an H100 SXM: 900 GB/s both directions, 450 GB/s each way (H100 whitepaper)."""
H100_RING_BUSBW_BYTES_PER_S = 370e9
"""Fit figure: NCCL ring all-reduce busbw on 8 H100s, "365-370 GBps when gpus from 2 to 8" at 2-4 GiB
(NVIDIA/nccl issue 1455) and 370 GB/s in Jeaugey's answer (NVIDIA/nccl-tests issue 212)."""
H100_NVLS_BUSBW_BYTES_PER_S = 480e9
"""Fit figure: NCCL NVLS all-reduce peak busbw on 8 H100s, ~480 GB/s (NVIDIA/nccl-tests issue 212, Jeaugey)."""
A100_32KIB_BUSBW_BYTES_PER_S = 1.31e9
"""Fit figure: busbw of a 32 KiB all-reduce on 8 A100 SXM (300 GB/s each way), nccl-tests, in stas00's
ml-engineering, network/README.md at commit d28da7a4, 'Real network throughput'."""


def nvls_bytes_per_gpu(n: int, nbytes: float) -> float:
    """Bytes each GPU sends (and receives) in NCCL's NVLS all-reduce: ``(n+1)/n * nbytes``.

    A switch reduce-scatter, in which each GPU contributes ``nbytes`` and gets
    back its reduced ``nbytes / n`` shard, then a switch all-gather, in which it
    sends its shard and receives all ``nbytes``. One GPU sends nothing.
    """
    check_positive_int("n (the number of GPUs)", n)
    check_nonnegative("nbytes", nbytes)
    return 0.0 if n == 1 else (n + 1) / n * nbytes


RING_LINK_EFFICIENCY = H100_RING_BUSBW_BYTES_PER_S / H100_NVLINK_ONE_WAY_BYTES_PER_S
"""Fraction of the one-way NVLink line rate a ring all-reduce sustains: 370 / 450 = 0.822 (fit on H100)."""
NVLS_LINK_EFFICIENCY = (H100_NVLS_BUSBW_BYTES_PER_S / bus_bandwidth_factor("all_reduce", 8)
                        * nvls_bytes_per_gpu(8, 1.0) / H100_NVLINK_ONE_WAY_BYTES_PER_S)
"""Fraction of the one-way line rate NVLS sustains on the ``(n+1)/n`` bytes it moves: busbw 480 is algbw
274.3 GB/s on 8 GPUs, so ``274.3 * 9/8 / 450 = 0.686`` (fit on H100)."""


def _ring_bytes_per_gpu(n: int, nbytes: float) -> float:
    """Bytes each GPU sends in a ring all-reduce, ``2(n-1)/n * nbytes``: nccl-tests' busbw factor."""
    return bus_bandwidth_factor("all_reduce", n) * nbytes


ALLREDUCE_BASE_LATENCY_S = (_ring_bytes_per_gpu(8, 32 * 1024) / A100_32KIB_BUSBW_BYTES_PER_S
                            - _ring_bytes_per_gpu(8, 32 * 1024) / (RING_LINK_EFFICIENCY * 300e9))
"""Fixed seconds of one all-reduce call inside an NVLink domain: 43.5 us, fitted on the 32 KiB all-reduce of
8 A100s (43.8 us measured, of which 0.2 us is the bytes at the ring's efficiency)."""


def nccl_allreduce_time(n: int, nbytes: float, link_bandwidth: float, algorithm: str = "ring", *,
                        latency: float = ALLREDUCE_BASE_LATENCY_S, link_efficiency: float | None = None) -> float:
    """Seconds NCCL takes to all-reduce ``nbytes`` per GPU over ``n`` GPUs of one NVLink domain.

    ``latency + V / (efficiency * link_bandwidth)``, with ``V`` the bytes each
    GPU sends: ``2(n-1)/n * nbytes`` for ``"ring"``, ``(n+1)/n * nbytes`` for
    ``"nvls"`` (:func:`nvls_bytes_per_gpu`). ``link_bandwidth`` is the one-way
    NVLink rate per GPU in bytes/s; ``link_efficiency`` defaults to the fitted
    :data:`RING_LINK_EFFICIENCY` or :data:`NVLS_LINK_EFFICIENCY`. For the ideal
    pass ``link_efficiency=1.0`` (and a latency of your choice): the ring then
    equals :func:`utils.parallel.comm.network.ring_allreduce_time` with its
    ``2(n-1)`` step latencies folded into one ``latency``. One GPU needs no time.
    """
    check_positive_int("n (the number of GPUs)", n)
    check_nonnegative("nbytes", nbytes)
    check_positive("link_bandwidth (bytes/s)", link_bandwidth)
    check_nonnegative("latency (seconds)", latency)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; allowed: {', '.join(ALGORITHMS)}")
    if link_efficiency is None:
        link_efficiency = RING_LINK_EFFICIENCY if algorithm == "ring" else NVLS_LINK_EFFICIENCY
    if not 0 < link_efficiency <= 1:
        raise ValueError(f"link_efficiency must be in (0, 1], got {link_efficiency!r}")
    if n == 1:
        return 0.0
    sent = _ring_bytes_per_gpu(n, nbytes) if algorithm == "ring" else nvls_bytes_per_gpu(n, nbytes)
    return latency + sent / (link_efficiency * link_bandwidth)
