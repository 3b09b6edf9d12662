"""Tests of utils.parallel.comm.nccl_protocols: NCCL's LL, LL128 and Simple, priced by its tuning model."""

from __future__ import annotations

import pytest

from utils.parallel.comm import nccl_protocols as proto

B = 100e9  # a round Simple busbw (bytes/s) so that every value below is worked by hand


def test_tuning_constants_as_read_from_nccl():
    assert proto.PROTOCOLS == ("LL", "LL128", "Simple")
    assert proto.RING_BASE_LATENCY_S == {"LL": 6.6e-6, "LL128": 14.0e-6, "Simple": 8.4e-6}
    assert proto.RING_NVLINK_STEP_LATENCY_S == {"LL": 0.6e-6, "LL128": 1.9e-6, "Simple": 3.4e-6}
    assert proto.NVLS_NVLINK_LATENCY_S == 25e-6
    assert proto.BANDWIDTH_FRACTION == {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}


def test_ring_latency_pays_two_n_minus_one_steps():
    # 8 GPUs: 14 steps. LL 6.6 + 14 * 0.6, LL128 14.0 + 14 * 1.9, Simple 8.4 + 14 * 3.4 (n - 1 steps would give
    # 10.8, 27.3, 32.2)
    assert proto.ring_protocol_latency(8, "LL") == pytest.approx(15.0e-6)
    assert proto.ring_protocol_latency(8, "LL128") == pytest.approx(40.6e-6)
    assert proto.ring_protocol_latency(8, "Simple") == pytest.approx(56.0e-6)
    assert proto.ring_protocol_latency(2, "Simple") == pytest.approx(15.2e-6)  # 8.4 + 2 * 3.4
    assert proto.ring_protocol_latency(1, "LL") == 0.0


def test_ll_carries_half_the_bandwidth():
    # 1 MB on 8 GPUs sends 1.75 MB per GPU: at 50 GB/s (LL), 92 GB/s (LL128), 100 GB/s (Simple)
    assert proto.ring_protocol_time(8, 1e6, B, "LL") == pytest.approx(15.0e-6 + 35.0e-6)
    assert proto.ring_protocol_time(8, 1e6, B, "LL128") == pytest.approx(40.6e-6 + 1.75e6 / 92e9)  # 59.62 us
    assert proto.ring_protocol_time(8, 1e6, B, "Simple") == pytest.approx(56.0e-6 + 17.5e-6)
    # the bandwidth term of LL is exactly twice Simple's
    ll = proto.ring_protocol_time(8, 1e9, B, "LL") - proto.ring_protocol_latency(8, "LL")
    simple = proto.ring_protocol_time(8, 1e9, B, "Simple") - proto.ring_protocol_latency(8, "Simple")
    assert ll == pytest.approx(2 * simple)
    assert proto.ring_protocol_time(1, 1e9, B, "LL") == 0.0


def test_crossovers_by_hand():
    # LL -> LL128: 25.6 us more latency, 1.75 * (1/0.5 - 1/0.92) / 100e9 = 1.5978e-11 s saved per byte: 1.602 MB
    assert proto.ring_protocol_crossover_nbytes(8, B, "LL", "LL128") == pytest.approx(1.60218e6, rel=1e-4)
    # LL128 -> Simple: 15.4 us more, 1.75 * (1/0.92 - 1) / 100e9 = 1.5217e-12 s per byte: 10.12 MB
    assert proto.ring_protocol_crossover_nbytes(8, B, "LL128", "Simple") == pytest.approx(1.01200e7, rel=1e-4)
    # LL -> Simple (LL128 disabled): 41 us over 1.75e-11 s per byte: 2.343 MB
    assert proto.ring_protocol_crossover_nbytes(8, B, "LL", "Simple") == pytest.approx(41e-6 / 1.75e-11)


def test_the_switch_happens_at_the_stated_sizes():
    # With LL at a quarter (NCCL before 2.21) the first switch would be at 0.50 MB; without LL128's 0.92 at 1.46 MB;
    # with n - 1 steps at 1.03 MB: 1.55 MB separates them all from the right answer.
    assert proto.ring_protocol_choice(8, 1.55e6, B) == "LL"
    assert proto.ring_protocol_choice(8, 1.65e6, B) == "LL128"
    assert proto.ring_protocol_choice(8, 10.0e6, B) == "LL128"
    assert proto.ring_protocol_choice(8, 10.3e6, B) == "Simple"
    assert proto.ring_protocol_choice(8, 0, B) == "LL"
    assert proto.ring_protocol_choice(8, 5e6, B, protocols=("LL", "Simple")) == "Simple"  # past 2.343 MB
    assert proto.ring_protocol_choice(8, 2e6, B, protocols=("Simple", "LL")) == "LL"  # order given does not matter


@pytest.mark.parametrize("nbytes", [2**12, 2**20, 2**22, 2**24, 2**27, 2**32])
def test_the_choice_is_the_minimum(nbytes):
    times = {p: proto.ring_protocol_time(8, nbytes, B, p) for p in proto.PROTOCOLS}
    chosen = proto.ring_protocol_choice(8, nbytes, B)
    assert times[chosen] == min(times.values())


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown protocol 'LL64'; allowed: LL, LL128, Simple"):
        proto.ring_protocol_time(8, 1e6, B, "LL64")
    with pytest.raises(ValueError, match="unknown protocol"):
        proto.ring_protocol_latency(8, "simple")  # NCCL's spelling is "Simple"
    with pytest.raises(ValueError, match="at least one"):
        proto.ring_protocol_choice(8, 1e6, B, protocols=())
    with pytest.raises(ValueError, match="more latency and more bandwidth"):
        proto.ring_protocol_crossover_nbytes(8, B, "Simple", "LL")
    with pytest.raises(ValueError, match="at least 2"):
        proto.ring_protocol_crossover_nbytes(1, B, "LL", "Simple")
    with pytest.raises(ValueError, match="bus_bandwidth"):
        proto.ring_protocol_time(8, 1e6, 0.0, "LL")
    with pytest.raises(ValueError, match="nbytes"):
        proto.ring_protocol_time(8, -1.0, B, "LL")
    with pytest.raises(ValueError, match="n \\(the number of GPUs\\)"):
        proto.ring_protocol_latency(0, "LL")
