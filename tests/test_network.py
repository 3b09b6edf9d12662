import pytest
from hypothesis import given
from hypothesis import strategies as st

from utils.network import ring_allreduce_time


def test_ring_allreduce_formula():
    # 8 GPUs, 1 GB, 100 GB/s, 5 us: 14 * 5e-6 + 1.75 * 1e9 / 1e11
    assert ring_allreduce_time(8, 1e9, 100e9, 5e-6) == pytest.approx(14 * 5e-6 + 0.0175)


def test_one_gpu_needs_no_communication():
    assert ring_allreduce_time(1, 1e9, 1e9, 1e-3) == 0.0


@given(st.integers(2, 4096), st.floats(1, 1e12))
def test_bandwidth_term_approaches_twice_the_message_time(n, nbytes):
    # The ring is bandwidth-optimal: each GPU sends 2(n-1)/n < 2 times the message.
    t = ring_allreduce_time(n, nbytes, 1e9, 0.0)
    assert nbytes / 1e9 <= t < 2 * nbytes / 1e9


@pytest.mark.parametrize("args", [(0, 1, 1, 0), (2, -1, 1, 0), (2, 1, 0, 0), (2, 1, 1, -1), (2.5, 1, 1, 0)])
def test_bad_input_raises(args):
    with pytest.raises(ValueError):
        ring_allreduce_time(*args)
