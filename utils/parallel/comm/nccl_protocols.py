"""NCCL's three protocols (LL, LL128, Simple) and how its tuning model picks one for a ring all-reduce, by size.

NCCL moves data in one of three wire formats, and before each call it
predicts, for every algorithm and protocol, ``latency + bytes / bandwidth``
and runs the cheapest (``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` in
NVIDIA/nccl ``src/graph/tuning.cc``; read at commit 5067397c2676 (NCCL 2.30.7),
and the same constants at tag v2.27.7-1, the NCCL of the book's H200 sweep):

- **LL** (low latency): a 16-byte line carries 8 bytes of data and two 4-byte
  flags (``union ncclLLFifoLine`` in ``src/include/device.h``), so the
  receiver polls the flag instead of waiting for a fence: the smallest
  latency, half the bandwidth (``busBw * .5``).
- **LL128**: a 128-byte line carries 120 bytes of data and one 8-byte flag
  (``NCCL_LL128_DATAELEMS = NCCL_LL128_LINEELEMS - 1``); NCCL prices it at
  ``busBw * 0.92`` (its comment: ``120.0/128.0``), with a larger latency.
- **Simple**: whole chunks behind a memory fence and a flag: all of the
  bandwidth, the largest latency.

For a ring all-reduce of ``n`` GPUs inside one NVLink domain the tuning model
gives protocol ``p`` the latency ``baseLat[Ring][p] + 2(n-1) * hwLat[NVLINK][Ring][p]``
(2(n-1) steps) and the bus bandwidth ``fraction[p] * busBw``, so that

    time_p(M) = latency_p + 2(n-1)/n * M / (fraction_p * busBw)

and NCCL runs ``argmin_p time_p``: LL for small buffers, LL128 in the middle,
Simple for large ones. Left out of this model: NCCL's per-generation caps
(``llMaxBws``: ring LL at most 87.7 GB/s busbw on Ampere, 141 on Hopper;
``perChMaxRingLL128Bws`` per channel), its choice of fewer channels for small
buffers, trees, and multi-node rings. NCCL before 2.21 priced ring LL for an
all-reduce at a quarter of ``busBw``, not a half (``1.0/4.0`` at tag v2.20.3-1).
"""

from __future__ import annotations

from utils.validate import check_nonnegative, check_positive, check_positive_int

PROTOCOLS = ("LL", "LL128", "Simple")
"""NCCL's protocols, in its tables' order (``NCCL_PROTO_LL``, ``NCCL_PROTO_LL128``, ``NCCL_PROTO_SIMPLE``)."""

RING_BASE_LATENCY_S = {"LL": 6.6e-6, "LL128": 14.0e-6, "Simple": 8.4e-6}
"""Seconds a ring call of each protocol costs once: ``baseLatencies[Ring]`` = {6.6, 14.0, 8.4} us (tuning.cc,
NCCL 2.30.7 and 2.27.7)."""
RING_NVLINK_STEP_LATENCY_S = {"LL": 0.6e-6, "LL128": 1.9e-6, "Simple": 3.4e-6}
"""Seconds each ring step over NVLink adds: ``hwLatencies[NVLINK][Ring]`` = {0.6, 1.9, 3.4} us (tuning.cc)."""
NVLS_NVLINK_LATENCY_S = 25e-6
"""Seconds of an NVLS (NVLink SHARP) all-reduce in one node: ``hwLatencies[NVLINK][NVLS][Simple]`` = 25 us, with
a base latency of 0 (tuning.cc); NVLS runs the Simple protocol only."""
BANDWIDTH_FRACTION = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}
"""Fraction of the ring's Simple bus bandwidth each protocol reaches: LL ``busBw * .5`` (8 data bytes per
16-byte line), LL128 ``busBw * 0.92`` (120 of 128 bytes; tuning.cc writes 0.92), Simple all of it."""


def _check_protocol(protocol: str) -> str:
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; allowed: {', '.join(PROTOCOLS)}")
    return protocol


def ring_protocol_latency(n: int, protocol: str) -> float:
    """Seconds of latency NCCL's tuning model gives a ring all-reduce of ``n`` GPUs over NVLink.

    ``baseLat[p] + 2(n-1) * hwLat[p]``: for 8 GPUs 15.0 us (LL), 40.6 us
    (LL128), 56.0 us (Simple). One GPU needs none.
    """
    check_positive_int("n (the number of GPUs)", n)
    _check_protocol(protocol)
    if n == 1:
        return 0.0
    return RING_BASE_LATENCY_S[protocol] + 2 * (n - 1) * RING_NVLINK_STEP_LATENCY_S[protocol]


def ring_protocol_time(n: int, nbytes: float, bus_bandwidth: float, protocol: str) -> float:
    """Seconds of a ring all-reduce of ``nbytes`` per GPU with one protocol, as NCCL's tuning model prices it.

    ``ring_protocol_latency(n, p) + 2(n-1)/n * nbytes / (BANDWIDTH_FRACTION[p] * bus_bandwidth)``;
    ``bus_bandwidth`` (bytes/s) is the busbw the Simple protocol reaches. One GPU needs no time.
    """
    check_positive_int("n (the number of GPUs)", n)
    check_nonnegative("nbytes", nbytes)
    check_positive("bus_bandwidth (bytes/s)", bus_bandwidth)
    _check_protocol(protocol)
    if n == 1:
        return 0.0
    sent = 2 * (n - 1) / n * nbytes
    return ring_protocol_latency(n, protocol) + sent / (BANDWIDTH_FRACTION[protocol] * bus_bandwidth)


def ring_protocol_choice(n: int, nbytes: float, bus_bandwidth: float,
                         protocols: tuple[str, ...] = PROTOCOLS) -> str:
    """The protocol NCCL's tuning model runs: ``argmin_p`` of :func:`ring_protocol_time` over ``protocols``.

    A tie goes to the earlier protocol of :data:`PROTOCOLS` (NCCL keeps the
    first minimum it meets, in the same order).
    """
    if not protocols:
        raise ValueError(f"protocols must name at least one of {', '.join(PROTOCOLS)}, got an empty tuple")
    for p in protocols:
        _check_protocol(p)
    ordered = [p for p in PROTOCOLS if p in protocols]
    return min(ordered, key=lambda p: ring_protocol_time(n, nbytes, bus_bandwidth, p))


def ring_protocol_crossover_nbytes(n: int, bus_bandwidth: float, low_latency: str, high_bandwidth: str) -> float:
    """Bytes per GPU above which ``high_bandwidth`` beats ``low_latency`` in the ring: where their times are equal.

    ``(lat_h - lat_l) / (2(n-1)/n * (1/(f_l B) - 1/(f_h B)))``. On 8 GPUs with
    ``B`` = 0.822 * 300 GB/s (A100) LL gives way to LL128 at 3.95 MB and
    LL128 to Simple at 25.0 MB.
    """
    check_positive_int("n (the number of GPUs)", n)
    if n == 1:
        raise ValueError("n must be at least 2 for a crossover: one GPU sends nothing")
    check_positive("bus_bandwidth (bytes/s)", bus_bandwidth)
    low, high = _check_protocol(low_latency), _check_protocol(high_bandwidth)
    extra_latency = ring_protocol_latency(n, high) - ring_protocol_latency(n, low)
    saved_per_byte = 2 * (n - 1) / n * (1 / BANDWIDTH_FRACTION[low] - 1 / BANDWIDTH_FRACTION[high]) / bus_bandwidth
    if extra_latency <= 0 or saved_per_byte <= 0:
        raise ValueError(f"{high!r} must have more latency and more bandwidth than {low!r}; allowed pairs: "
                         "('LL', 'LL128'), ('LL', 'Simple'), ('LL128', 'Simple')")
    return extra_latency / saved_per_byte
