"""utils.parallel.comm.bandwidth: link-rate conversion and nccl-tests' algorithm and bus bandwidth."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from utils.parallel.comm.bandwidth import (
    COLLECTIVES,
    algorithm_bandwidth,
    allreduce_bus_bandwidth,
    bus_bandwidth,
    bus_bandwidth_factor,
    gbit_per_s_to_bytes_per_s,
)
from utils.parallel.comm.network import ring_allreduce_time

BW = 100e9  # 100 GB/s per direction


def test_a_400_gbit_port_moves_50_gb_per_s():
    assert gbit_per_s_to_bytes_per_s(400) == 50e9
    assert gbit_per_s_to_bytes_per_s(0) == 0


@pytest.mark.parametrize("collective, n, factor", [
    ("all_reduce", 8, 2 * 7 / 8), ("all_reduce", 2, 1.0), ("all_reduce", 1, 0.0),
    ("reduce_scatter", 8, 7 / 8), ("all_gather", 8, 7 / 8), ("all_to_all", 4, 3 / 4),
    ("broadcast", 8, 1.0), ("reduce", 8, 1.0),
])
def test_nccl_tests_bus_bandwidth_factors(collective, n, factor):
    assert bus_bandwidth_factor(collective, n) == pytest.approx(factor)


def test_every_collective_has_a_factor_at_most_two():
    for collective in COLLECTIVES:
        assert 0 <= bus_bandwidth_factor(collective, 1024) < 2


def test_bus_bandwidth_of_an_8_gpu_all_reduce():
    # 1 GB in 10 ms: algbw 100 GB/s, busbw 175 GB/s.
    algbw = algorithm_bandwidth(1e9, 0.01)
    assert algbw == pytest.approx(100e9)
    assert allreduce_bus_bandwidth(algbw, 8) == pytest.approx(175e9)
    assert bus_bandwidth("all_gather", algbw, 8) == pytest.approx(87.5e9)


@given(st.integers(2, 4096), st.floats(1e3, 1e12))
def test_ring_bus_bandwidth_is_the_link_bandwidth_for_any_n(n, nbytes):
    # The point of busbw: an ideal ring measures the link bandwidth whatever the number of ranks.
    algbw = algorithm_bandwidth(nbytes, ring_allreduce_time(n, nbytes, BW, 0.0))
    assert allreduce_bus_bandwidth(algbw, n) == pytest.approx(BW)


@pytest.mark.parametrize("call", [
    lambda: bus_bandwidth_factor("allreduce", 8),
    lambda: bus_bandwidth_factor("all_reduce", 0),
    lambda: bus_bandwidth("all_reduce", -1.0, 8),
    lambda: algorithm_bandwidth(1e9, 0),
    lambda: algorithm_bandwidth(-1, 1),
    lambda: gbit_per_s_to_bytes_per_s(-1),
])
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()
