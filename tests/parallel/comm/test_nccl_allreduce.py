"""Tests of utils.parallel.comm.nccl_allreduce: NCCL's all-reduce inside an NVLink domain, calibrated."""

from __future__ import annotations

import math

import pytest

from utils.parallel.comm import nccl_allreduce as nccl
from utils.parallel.comm.bandwidth import algorithm_bandwidth, allreduce_bus_bandwidth
from utils.parallel.comm.network import in_network_allreduce_time, ring_allreduce_time


def test_fitted_constants_by_hand():
    assert nccl.RING_LINK_EFFICIENCY == pytest.approx(370 / 450)  # 0.822
    # NVLS busbw 480 on 8 GPUs is algbw 480 / 1.75 = 274.29 GB/s; each GPU moves 9/8 of the buffer: 308.57 GB/s
    assert nccl.NVLS_LINK_EFFICIENCY == pytest.approx(480 / 1.75 * 9 / 8 / 450)  # 0.686
    # 32 KiB at busbw 1.31 GB/s on 8 GPUs: 32768 * 1.75 / 1.31e9 = 43.774 us, of which 57344 / 246.67e9 = 0.232 us
    # is the bytes at 0.822 of A100's 300 GB/s
    assert nccl.ALLREDUCE_BASE_LATENCY_S == pytest.approx(43.774e-6 - 0.2325e-6, rel=1e-4)


def test_nvls_bytes_per_gpu():
    assert nccl.nvls_bytes_per_gpu(8, 8e9) == pytest.approx(9e9)
    assert nccl.nvls_bytes_per_gpu(1, 8e9) == 0.0


def test_one_gigabyte_on_eight_h100_by_hand():
    latency = nccl.ALLREDUCE_BASE_LATENCY_S
    ring = nccl.nccl_allreduce_time(8, 1e9, 450e9, "ring")
    nvls = nccl.nccl_allreduce_time(8, 1e9, 450e9, "nvls")
    assert ring == pytest.approx(latency + 1.75e9 / 370e9)  # 4.773 ms
    assert nvls == pytest.approx(latency + 1.125e9 / (480e9 / 1.75 * 9 / 8))  # 3.689 ms
    assert ring / nvls == pytest.approx(1.294, abs=1e-3)  # not the ideal 1.75
    busbw = allreduce_bus_bandwidth(algorithm_bandwidth(1e9, nvls), 8)
    assert busbw / 450e9 == pytest.approx(1.05, abs=0.01)  # about the link rate, as measured


def test_the_ideal_is_kept():
    ideal_ring = nccl.nccl_allreduce_time(8, 1e9, 450e9, "ring", latency=14 * 2e-6, link_efficiency=1.0)
    assert ideal_ring == pytest.approx(ring_allreduce_time(8, 1e9, 450e9, 2e-6), rel=1e-12)
    ideal_nvls = nccl.nccl_allreduce_time(8, 1e9, 450e9, "nvls", latency=0.0, link_efficiency=1.0)
    assert ideal_nvls == pytest.approx(9 / 8 * in_network_allreduce_time(8, 1e9, 450e9, 0.0))


def test_the_ramp_below_the_plateau():
    busbw = [allreduce_bus_bandwidth(algorithm_bandwidth(m, nccl.nccl_allreduce_time(8, m, 450e9)), 8)
             for m in (2**15, 2**20, 2**24, 2**30, 2**34)]
    assert busbw == sorted(busbw)
    assert busbw[0] < 0.01 * busbw[-1]  # latency-bound at 32 KiB
    assert busbw[-1] == pytest.approx(370e9, rel=1e-3)  # the plateau is the fitted ring efficiency


def test_one_gpu_and_bad_inputs():
    assert nccl.nccl_allreduce_time(1, 1e9, 450e9) == 0.0
    with pytest.raises(ValueError, match="algorithm"):
        nccl.nccl_allreduce_time(8, 1e9, 450e9, "tree")
    for bad in (0.0, 1.5, math.nan):
        with pytest.raises(ValueError, match="link_efficiency"):
            nccl.nccl_allreduce_time(8, 1e9, 450e9, link_efficiency=bad)
    with pytest.raises(ValueError):
        nccl.nccl_allreduce_time(8, -1, 450e9)
