import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from utils.gpu.hardware import WARP_SIZE, spec
from utils.gpu.simt import (POINTER_CHASE_DRAM_LATENCY, branch_efficiency, branch_trace, divergent_warps,
                            trace_efficiency, warps_needed_per_sm)

lane = np.arange(WARP_SIZE)


def test_even_odd_split_with_equal_paths_wastes_half_the_lanes():
    # if (threadIdx.x % 2 == 0) {A} else {B}, A and B one instruction each: 2 issues, 32 useful of 64 slots.
    taken = np.tile(lane % 2 == 0, 4)
    assert branch_efficiency(taken, 1, 1) == 0.5
    assert divergent_warps(taken) == 4


def test_warp_aligned_branch_does_not_diverge():
    tid = np.arange(8 * WARP_SIZE)
    taken = (tid // WARP_SIZE) % 2 == 0  # branch on the warp index: every warp agrees
    assert branch_efficiency(taken, 5, 3) == 1.0
    assert divergent_warps(taken) == 0


def test_one_lane_on_a_long_path():
    # Only lane 0 runs 10 instructions; the other 31 lanes run 1: (10 + 31) useful of 32 * 11 slots.
    assert branch_efficiency(lane == 0, 10, 1) == pytest.approx(41 / 352)


def test_bounds_check_of_a_vector_add():
    # n = 1000 elements, 1024 threads launched: only the warp covering 992..1023 diverges.
    taken = np.arange(1024) < 1000
    assert divergent_warps(taken) == 1
    # then: 1 instruction (the add), else: nothing; useful 1000 lane-slots of 32 warps x 1 issue.
    assert branch_efficiency(taken, 1, 0) == pytest.approx(1000 / 1024)


def test_trace_lists_both_paths_with_complementary_masks():
    taken = lane < 8
    slots = branch_trace(taken, then_instructions=2, else_instructions=3, before=1, after=1)
    assert [s.label.split()[0] for s in slots] == ["before", "then", "then", "else", "else", "else", "after"]
    assert slots[1].active.sum() == 8 and slots[3].active.sum() == 24
    assert slots[0].active.all() and slots[-1].active.all()
    uniform = branch_trace(np.ones(WARP_SIZE, bool), 2, 3)
    assert [s.label.split()[0] for s in uniform] == ["then", "then"]  # nobody takes the else: it is skipped


@given(st.lists(st.booleans(), min_size=WARP_SIZE, max_size=WARP_SIZE), st.integers(0, 20), st.integers(0, 20))
def test_trace_and_formula_agree_for_one_warp(bits, a, b):
    if a + b == 0:
        return
    taken = np.array(bits)
    assert trace_efficiency(branch_trace(taken, a, b)) == pytest.approx(branch_efficiency(taken, a, b))


@given(st.lists(st.booleans(), min_size=4 * WARP_SIZE, max_size=4 * WARP_SIZE), st.integers(1, 20),
       st.integers(1, 20))
def test_efficiency_is_bounded_and_sorting_threads_never_hurts(bits, a, b):
    taken = np.array(bits)
    eff = branch_efficiency(taken, a, b)
    assert 1 / WARP_SIZE <= eff <= 1.0
    # Grouping threads by branch direction leaves at most one divergent warp and cannot lower efficiency.
    grouped = np.sort(taken)[::-1]
    assert divergent_warps(grouped) <= 1
    assert branch_efficiency(grouped, a, b) >= eff - 1e-12


@given(st.lists(st.booleans(), min_size=WARP_SIZE, max_size=WARP_SIZE), st.integers(1, 20), st.integers(1, 20))
def test_shuffling_lanes_within_a_warp_changes_nothing(bits, a, b):
    taken = np.array(bits)
    assert branch_efficiency(taken[::-1].copy(), a, b) == pytest.approx(branch_efficiency(taken, a, b))


@pytest.mark.parametrize("call", [
    lambda: branch_efficiency(np.ones(33, bool), 1, 1),  # not a whole number of warps
    lambda: branch_efficiency(np.ones(32), 1, 1),  # floats, not bools
    lambda: branch_efficiency(np.ones(32, bool), 0, 0),  # no work on either path
    lambda: branch_efficiency(np.ones(32, bool), -1, 1),
    lambda: branch_efficiency(np.ones(32, bool), 1, 1, warp_size=0),
    lambda: branch_trace(np.ones(32, bool), 1, 1, before=-1),
    lambda: trace_efficiency([]),
])
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()


def test_measured_latencies_convert_to_nanoseconds():
    # gpu-benches: V100 436 cycles at 1380 MHz, H100 PCIe 658.4 cycles at 1755 MHz.
    assert POINTER_CHASE_DRAM_LATENCY["V100-PCIe"].seconds == pytest.approx(316e-9, rel=1e-3)
    assert POINTER_CHASE_DRAM_LATENCY["H100-PCIe"].seconds == pytest.approx(375e-9, rel=1e-3)


def test_warps_needed_on_h100_and_v100():
    h100, v100 = spec("H100-SXM"), spec("V100-SXM2")
    latency = POINTER_CHASE_DRAM_LATENCY["H100-PCIe"].seconds
    # 3.35 TB/s x 375 ns = 1.26 MB; / 132 SMs = 9.5 kB; / 512 B per warp (16 B per thread) = 18.6 warps.
    assert warps_needed_per_sm(h100.hbm_bandwidth, latency, h100.sm_count, 16) == pytest.approx(18.6, abs=0.05)
    # 4-byte loads need 4x the warps: more than the 64 an SM can hold.
    assert warps_needed_per_sm(h100.hbm_bandwidth, latency, h100.sm_count, 4) > h100.max_warps_per_sm
    # ...unless each thread keeps 4 independent loads in flight.
    assert warps_needed_per_sm(h100.hbm_bandwidth, latency, h100.sm_count, 4, 4) == pytest.approx(18.6, abs=0.05)
    # V100: 900 GB/s x 316 ns / 80 SMs / 128 B = 27.8 warps of 4-byte loads: fits in 64.
    v = warps_needed_per_sm(v100.hbm_bandwidth, POINTER_CHASE_DRAM_LATENCY["V100-PCIe"].seconds, v100.sm_count, 4)
    assert v == pytest.approx(27.8, abs=0.05) and v < v100.max_warps_per_sm


@given(st.floats(1e9, 1e13), st.floats(1e-8, 1e-5), st.integers(1, 200), st.sampled_from([1, 2, 4, 8, 16]),
       st.integers(1, 8))
def test_warps_needed_is_bytes_in_flight_over_bytes_per_warp(bw, lat, sms, nbytes, loads):
    warps = warps_needed_per_sm(bw, lat, sms, nbytes, loads)
    assert warps * sms * WARP_SIZE * nbytes * loads == pytest.approx(bw * lat)
    assert warps_needed_per_sm(bw, 2 * lat, sms, nbytes, loads) == pytest.approx(2 * warps)


@pytest.mark.parametrize("args", [(0, 1e-7, 132, 16), (1e12, 0, 132, 16), (1e12, 1e-7, 0, 16),
                                  (1e12, 1e-7, 132, 0), (1e12, 1e-7, 132, 16, 0), (1e12, 1e-7, 132, 2.5)])
def test_warps_needed_rejects_bad_input(args):
    with pytest.raises(ValueError):
        warps_needed_per_sm(*args)
