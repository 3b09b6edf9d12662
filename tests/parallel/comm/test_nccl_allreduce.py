"""Tests of utils.parallel.comm.nccl_allreduce: NCCL's all-reduce inside an NVLink domain, calibrated."""

from __future__ import annotations

import math

import pytest

from utils.parallel.comm import nccl_allreduce as nccl
from utils.parallel.comm import nccl_protocols as proto
from utils.parallel.comm.bandwidth import algorithm_bandwidth, allreduce_bus_bandwidth
from utils.parallel.comm.network import in_network_allreduce_time, ring_allreduce_time

A100_RING_BUSBW = 370 / 450 * 300e9  # 246.67 GB/s: the fitted ring efficiency on A100's 300 GB/s links


def _busbw(nbytes: float, seconds: float) -> float:
    return allreduce_bus_bandwidth(algorithm_bandwidth(nbytes, seconds), 8)


def test_fitted_constants_by_hand():
    assert nccl.RING_LINK_EFFICIENCY == pytest.approx(370 / 450)  # 0.822
    # NVLS busbw 480 on 8 GPUs is algbw 480 / 1.75 = 274.29 GB/s; each GPU moves 9/8 of the buffer: 308.57 GB/s
    assert nccl.NVLS_LINK_EFFICIENCY == pytest.approx(480 / 1.75 * 9 / 8 / 450)  # 0.686
    # 32 KiB at busbw 1.31 GB/s on 8 GPUs: 32768 * 1.75 / 1.31e9 = 43.774 us, of which NCCL's ring LL is
    # 15.0 us of latency and 57344 B at half of 246.67 GB/s, 0.465 us: 28.309 us is left
    assert nccl.ALLREDUCE_BASE_LATENCY_S == pytest.approx(43.774e-6 - 15.0e-6 - 0.4649e-6, rel=1e-4)


def test_the_fit_row_is_reproduced():
    t = nccl.nccl_allreduce_time(8, 32 * 1024, 300e9)
    assert _busbw(32 * 1024, t) == pytest.approx(1.31e9, rel=1e-9)


def test_nvls_bytes_per_gpu():
    assert nccl.nvls_bytes_per_gpu(8, 8e9) == pytest.approx(9e9)
    assert nccl.nvls_bytes_per_gpu(1, 8e9) == 0.0


def test_protocol_switches_on_eight_a100s():
    # LL -> LL128 where 25.6 us of latency equals 1.75 * (2 - 1/0.92) / 246.67e9 per byte: 3.952 MB;
    # LL128 -> Simple at 15.4 us / (1.75 * (1/0.92 - 1) / 246.67e9): 24.96 MB
    assert proto.ring_protocol_crossover_nbytes(8, A100_RING_BUSBW, "LL", "LL128") == pytest.approx(3.952e6, rel=1e-3)
    assert proto.ring_protocol_crossover_nbytes(8, A100_RING_BUSBW, "LL128", "Simple") == pytest.approx(
        24.96e6, rel=1e-3)
    choices = [nccl.nccl_allreduce_protocol(8, m, 300e9) for m in (32 * 1024, 3.9e6, 4.0e6, 24.5e6, 25.5e6, 2**30)]
    assert choices == ["LL", "LL", "LL128", "LL128", "Simple", "Simple"]
    assert nccl.nccl_allreduce_protocol(8, 2**30, 300e9, "nvls") == "Simple"


def test_h200_runs_ring_ll_at_one_mebibyte():
    # stas00's H200 log: NCCL's Ring/LL up to 1 MiB. At 370 GB/s the LL -> LL128 switch is at 5.93 MB.
    assert nccl.nccl_allreduce_protocol(8, 2**20, 450e9) == "LL"
    # 1 MiB: 28.31 + 15.0 us + 1.835 MB at 185 GB/s (9.92 us) = 53.23 us
    t = nccl.nccl_allreduce_time(8, 2**20, 450e9)
    assert t == pytest.approx(nccl.ALLREDUCE_BASE_LATENCY_S + 15.0e-6 + 1.75 * 2**20 / 185e9)
    assert t == pytest.approx(53.23e-6, rel=1e-3)


@pytest.mark.parametrize("nbytes", [2**15, 2**20, 3.9e6, 4.0e6, 2**24, 24.5e6, 25.5e6, 2**30])
def test_the_time_is_the_minimum_over_protocols(nbytes):
    forced = {p: nccl.nccl_allreduce_time(8, nbytes, 300e9, protocol=p) for p in proto.PROTOCOLS}
    assert nccl.nccl_allreduce_time(8, nbytes, 300e9) == min(forced.values())
    assert forced[nccl.nccl_allreduce_protocol(8, nbytes, 300e9)] == min(forced.values())


def test_sixteen_mebibytes_on_a100_by_hand():
    # 16 MiB sends 29.36 MB per GPU: LL 15.0 + 238.1, LL128 40.6 + 129.4, Simple 56.0 + 119.0 us: LL128 wins
    m = 16 * 2**20
    assert nccl.nccl_allreduce_protocol(8, m, 300e9) == "LL128"
    expected = nccl.ALLREDUCE_BASE_LATENCY_S + 40.6e-6 + 1.75 * m / (0.92 * A100_RING_BUSBW)
    assert nccl.nccl_allreduce_time(8, m, 300e9) == pytest.approx(expected)
    assert nccl.nccl_allreduce_time(8, m, 300e9) == pytest.approx(198.3e-6, rel=1e-3)


def test_one_gigabyte_on_eight_h100_by_hand():
    latency = nccl.ALLREDUCE_BASE_LATENCY_S
    ring = nccl.nccl_allreduce_time(8, 1e9, 450e9, "ring")
    nvls = nccl.nccl_allreduce_time(8, 1e9, 450e9, "nvls")
    assert ring == pytest.approx(latency + 56.0e-6 + 1.75e9 / 370e9)  # Simple: 4.814 ms
    assert nvls == pytest.approx(latency + 25e-6 + 1.125e9 / (480e9 / 1.75 * 9 / 8))  # 3.699 ms
    assert ring / nvls == pytest.approx(1.301, abs=1e-3)  # not the ideal 1.75
    assert _busbw(1e9, nvls) / 450e9 == pytest.approx(1.05, abs=0.01)  # about the link rate, as measured


def test_the_ideal_is_kept():
    # Simple's 8.4 + 14 * 3.4 = 56 us on 8 GPUs is 14 steps of 4 us
    ideal_ring = nccl.nccl_allreduce_time(8, 1e9, 450e9, "ring", latency=0.0, link_efficiency=1.0, protocol="Simple")
    assert ideal_ring == pytest.approx(ring_allreduce_time(8, 1e9, 450e9, 4e-6), rel=1e-12)
    ideal_nvls = nccl.nccl_allreduce_time(8, 1e9, 450e9, "nvls", latency=0.0, link_efficiency=1.0)
    assert ideal_nvls == pytest.approx(25e-6 + 9 / 8 * in_network_allreduce_time(8, 1e9, 450e9, 0.0))


def test_the_ramp_below_the_plateau():
    sizes = (2**15, 2**20, 2**22, 2**24, 2**26, 2**30, 2**34)
    busbw = [_busbw(m, nccl.nccl_allreduce_time(8, m, 450e9)) for m in sizes]
    assert busbw == sorted(busbw)
    assert busbw[0] < 0.01 * busbw[-1]  # latency-bound at 32 KiB
    assert busbw[-1] == pytest.approx(370e9, rel=2e-3)  # the fitted ring efficiency: 84 us of latency on 81 ms
    # The ramp is slower than one latency gives. With one latency for every size the bytes between 32 KiB and
    # 16 MiB would go at the plateau's 370 GB/s busbw; NCCL's switch from LL (15.0 us) to LL128 (40.6 us, 0.92 of
    # the busbw) makes them go at (29.36 - 0.057) MB / (155.12 - 43.62) us = 262.8 GB/s.
    t32, t16 = nccl.nccl_allreduce_time(8, 2**15, 450e9), nccl.nccl_allreduce_time(8, 2**24, 450e9)
    marginal = 1.75 * (2**24 - 2**15) / (t16 - t32)
    assert marginal == pytest.approx(262.8e9, rel=2e-3)


def test_one_gpu_and_bad_inputs():
    assert nccl.nccl_allreduce_time(1, 1e9, 450e9) == 0.0
    with pytest.raises(ValueError, match="unknown algorithm 'tree'; allowed: ring, nvls"):
        nccl.nccl_allreduce_time(8, 1e9, 450e9, "tree")
    for bad in (0.0, 1.5, math.nan):
        with pytest.raises(ValueError, match="link_efficiency"):
            nccl.nccl_allreduce_time(8, 1e9, 450e9, link_efficiency=bad)
    with pytest.raises(ValueError, match="nbytes"):
        nccl.nccl_allreduce_time(8, -1, 450e9)
    with pytest.raises(ValueError, match="unknown protocol 'LL256'"):
        nccl.nccl_allreduce_time(8, 1e9, 450e9, protocol="LL256")
    with pytest.raises(ValueError, match="NVLS runs the Simple protocol only"):
        nccl.nccl_allreduce_time(8, 1e9, 450e9, "nvls", protocol="LL")
    with pytest.raises(ValueError, match="latency"):
        nccl.nccl_allreduce_time(8, 1e9, 450e9, latency=-1e-6)
    with pytest.raises(ValueError, match="link_bandwidth"):
        nccl.nccl_allreduce_protocol(8, 1e9, 0.0)
