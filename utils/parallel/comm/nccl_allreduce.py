"""What NCCL reaches: an all-reduce inside one NVLink domain, calibrated on published nccl-tests figures.

The models of :mod:`utils.parallel.comm.network` are ideal: every byte at the
link's line rate, one small latency per step. They are bounds, and the
planner prices its rings with them. Measured all-reduces fall short of them
in four ways, and :func:`nccl_allreduce_time` puts each back:

1. **Link efficiency.** NCCL's rings reach about 80 % of NVLink's line rate
   ("450GB/s is the line rate. With the protocol overhead (~20%) NCCL can get
   an effective NVLink bandwidth of 370GB/s": S. Jeaugey, NCCL maintainer,
   NVIDIA/nccl-tests issue 212, 2024-05-06). :data:`RING_LINK_EFFICIENCY` is
   that ratio, fitted on H100 alone: the busbw of the Simple protocol.
2. **NVLink SHARP moves more than the buffer.** NCCL's NVLS all-reduce is a
   switch reduce-scatter (``multimem.ld_reduce``) then a switch all-gather
   (``multimem.st``): each GPU sends ``M`` (its share of every reduction) plus
   ``M/n`` (its reduced shard) and receives as much, ``(n+1)/n * M`` each way,
   not ``M``. Jeaugey gives the busbw NCCL reaches with it on 8 H100s: "a
   peak busBw of ~480GB/s (algbw ~275GB/s)" (same thread), not the
   ``2(n-1)/n * 450 = 787`` GB/s of the ideal model; the ratio of the two is
   :data:`NVLS_LINK_EFFICIENCY`, fitted on that one figure.
3. **A protocol chosen by size.** NCCL picks, per call, the protocol its
   tuning model predicts fastest (:mod:`utils.parallel.comm.nccl_protocols`,
   constants from NVIDIA/nccl ``src/graph/tuning.cc``, NCCL 2.30.7): for a ring
   of 8, LL (15.0 us, half the busbw) for small buffers, LL128 (40.6 us,
   0.92 of it) in the middle, Simple (56.0 us, all of it) for large ones;
   NVLS runs Simple only, with 25 us. So the latency grows with the size
   where the bandwidth does, and the ramp is slower than one latency gives.
4. **A fixed cost per call.** Launch and synchronisation cost tens of
   microseconds more than the tuning model's latencies, whatever the size:
   a 32 KiB all-reduce on 8 A100s took 43.8 us in stas00's nccl-tests sweep,
   of which the ring's LL protocol explains 15.5 us; the rest is
   :data:`ALLREDUCE_BASE_LATENCY_S`, fitted on that row.

``time = base latency + min over protocols p of (latency_p + bytes_p / (fraction_p * efficiency * link))``.
Left out: NCCL's per-generation caps on LL and LL128 (``llMaxBws``: ring LL
at most 87.7 GB/s busbw on Ampere, 141 on Hopper), its fewer channels for
small buffers, trees, multi-node rings; and NCCL before 2.21 priced ring LL
at a quarter of the busbw, not a half, so an older NCCL (the A100 sweep's is
not stated) ramps more slowly between 32 KiB and a few MiB.
"""

from __future__ import annotations

from utils.parallel.comm import nccl_protocols as _protocols
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
                            - min(_protocols.ring_protocol_time(8, 32 * 1024, RING_LINK_EFFICIENCY * 300e9, p)
                                  for p in _protocols.PROTOCOLS))
"""Fixed seconds of one all-reduce call on top of the protocol's own latency: 28.3 us, fitted on the 32 KiB
all-reduce of 8 A100s (43.8 us measured, of which 15.5 us is NCCL's ring LL: 15.0 us of latency and the
bytes at half the ring's busbw)."""


def _check_args(n: int, nbytes: float, link_bandwidth: float, algorithm: str, latency: float,
                link_efficiency: float | None, protocol: str | None) -> float:
    """Validate the arguments of :func:`nccl_allreduce_time`; return the link efficiency to use."""
    check_positive_int("n (the number of GPUs)", n)
    check_nonnegative("nbytes", nbytes)
    check_positive("link_bandwidth (bytes/s)", link_bandwidth)
    check_nonnegative("latency (seconds)", latency)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; allowed: {', '.join(ALGORITHMS)}")
    if protocol is not None and protocol not in _protocols.PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; allowed: None (NCCL's choice), "
                         f"{', '.join(_protocols.PROTOCOLS)}")
    if algorithm == "nvls" and protocol not in (None, "Simple"):
        raise ValueError(f"NVLS runs the Simple protocol only, got protocol={protocol!r}")
    if link_efficiency is None:
        link_efficiency = RING_LINK_EFFICIENCY if algorithm == "ring" else NVLS_LINK_EFFICIENCY
    if not 0 < link_efficiency <= 1:
        raise ValueError(f"link_efficiency must be in (0, 1], got {link_efficiency!r}")
    return link_efficiency


def nccl_allreduce_protocol(n: int, nbytes: float, link_bandwidth: float, algorithm: str = "ring", *,
                            link_efficiency: float | None = None) -> str:
    """The protocol NCCL runs for this all-reduce: the fastest by :mod:`~utils.parallel.comm.nccl_protocols`.

    ``"ring"``: ``argmin`` over LL, LL128, Simple of
    :func:`~utils.parallel.comm.nccl_protocols.ring_protocol_time` at busbw
    ``efficiency * link_bandwidth``; ``"nvls"``: ``"Simple"``, its only one.
    On 8 A100s (300 GB/s) LL up to 3.95 MB, LL128 up to 25.0 MB, then Simple.
    """
    efficiency = _check_args(n, nbytes, link_bandwidth, algorithm, 0.0, link_efficiency, None)
    if algorithm == "nvls":
        return "Simple"
    return _protocols.ring_protocol_choice(n, nbytes, efficiency * link_bandwidth)


def nccl_allreduce_time(n: int, nbytes: float, link_bandwidth: float, algorithm: str = "ring", *,
                        latency: float = ALLREDUCE_BASE_LATENCY_S, link_efficiency: float | None = None,
                        protocol: str | None = None) -> float:
    """Seconds NCCL takes to all-reduce ``nbytes`` per GPU over ``n`` GPUs of one NVLink domain.

    ``latency + latency_p + V / (fraction_p * efficiency * link_bandwidth)``,
    with ``p`` the protocol NCCL picks (:func:`nccl_allreduce_protocol`, or
    ``protocol`` to force one, as ``NCCL_PROTO`` does) and ``V`` the bytes
    each GPU sends: ``2(n-1)/n * nbytes`` for ``"ring"`` (``latency_p`` and
    ``fraction_p`` from :mod:`~utils.parallel.comm.nccl_protocols`),
    ``(n+1)/n * nbytes`` for ``"nvls"`` (:func:`nvls_bytes_per_gpu`; Simple,
    25 us, fraction 1). ``latency`` is the fixed cost per call on top,
    default the fitted :data:`ALLREDUCE_BASE_LATENCY_S`. ``link_bandwidth``
    is the one-way NVLink rate per GPU in bytes/s; ``link_efficiency``
    defaults to the fitted :data:`RING_LINK_EFFICIENCY` or
    :data:`NVLS_LINK_EFFICIENCY`. With ``link_efficiency=1.0``,
    ``protocol="Simple"`` and ``latency=0`` the ring is
    :func:`utils.parallel.comm.network.ring_allreduce_time` at 4 us per step
    (Simple's 8.4 + 14 * 3.4 = 56 us on 8 GPUs). One GPU needs no time.
    """
    efficiency = _check_args(n, nbytes, link_bandwidth, algorithm, latency, link_efficiency, protocol)
    if n == 1:
        return 0.0
    bus_bandwidth = efficiency * link_bandwidth
    if algorithm == "nvls":
        return latency + _protocols.NVLS_NVLINK_LATENCY_S + nvls_bytes_per_gpu(n, nbytes) / bus_bandwidth
    if protocol is None:
        protocol = _protocols.ring_protocol_choice(n, nbytes, bus_bandwidth)
    return latency + _protocols.ring_protocol_time(n, nbytes, bus_bandwidth, protocol)
