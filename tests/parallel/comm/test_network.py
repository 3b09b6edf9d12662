"""utils.parallel.comm.network: the alpha-beta cost models of all-reduce, one level and two."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from utils.parallel.comm.network import (
    ALLREDUCE_COST_MODELS,
    allreduce_lower_bound_time,
    direct_allreduce_time,
    double_binary_tree_allreduce_time,
    double_binary_tree_pipeline_blocks,
    flat_ring_allreduce_time,
    hierarchical_allreduce_time,
    in_network_allreduce_time,
    naive_allreduce_time,
    ring_allreduce_time,
    tree_allreduce_time,
)


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


# --- the other all-reduce cost models -------------------------------------------------------------------

ALPHA, BW = 5e-6, 100e9  # 5 us per message, 100 GB/s per direction


def test_naive_root_carries_2_n_minus_1_buffers():
    assert naive_allreduce_time(8, 1e9, BW, ALPHA) == pytest.approx(14 * (ALPHA + 0.01))


def test_direct_sends_n_minus_1_buffers():
    assert direct_allreduce_time(8, 1e9, BW, ALPHA) == pytest.approx(7 * (ALPHA + 0.01))


@pytest.mark.parametrize("n, rounds", [(2, 1), (4, 2), (5, 3), (8, 3), (9, 4), (1024, 10)])
def test_binomial_tree_takes_ceil_log2_rounds_each_way(n, rounds):
    assert tree_allreduce_time(n, 1e6, BW, ALPHA) == pytest.approx(2 * rounds * (ALPHA + 1e6 / BW))


def test_double_binary_tree_without_latency_sends_each_buffer_once_per_phase():
    assert double_binary_tree_allreduce_time(64, 1e9, BW, 0.0) == pytest.approx(2 * 1e9 / BW)


def test_double_binary_tree_closed_form_at_the_best_block_count():
    # Sanders, Speck and Traff (2009): one phase is (sqrt(m/B) + sqrt(2 L alpha))^2 when k* >= 1.
    n, m = 64, 1e9
    L = 6
    assert double_binary_tree_pipeline_blocks(n, m, BW, ALPHA) > 1
    phase = (math.sqrt(m / BW) + math.sqrt(2 * L * ALPHA)) ** 2
    assert double_binary_tree_allreduce_time(n, m, BW, ALPHA) == pytest.approx(2 * phase)


@given(st.integers(2, 100_000), st.floats(1, 1e11), st.floats(1e-7, 1e-4), st.floats(1, 1e6))
def test_double_binary_tree_default_blocks_are_the_best(n, nbytes, latency, blocks):
    best = double_binary_tree_allreduce_time(n, nbytes, BW, latency)
    assert best <= double_binary_tree_allreduce_time(n, nbytes, BW, latency, blocks=blocks) * (1 + 1e-12)


@pytest.mark.parametrize("name", sorted(ALLREDUCE_COST_MODELS))
@given(n=st.integers(2, 4096), nbytes=st.floats(0, 1e11, allow_subnormal=False),
       latency=st.floats(0, 1e-3, allow_subnormal=False))  # a subnormal size underflows the bound to 5e-324
def test_no_algorithm_beats_the_lower_bounds(name, n, nbytes, latency):
    # Bandwidth: every GPU must move 2(n-1)/n of its buffer (Patarasuk and Yuan 2009).
    # Latency: data from every GPU must reach every GPU, which takes at least ceil(log2 n) steps.
    t = ALLREDUCE_COST_MODELS[name](n, nbytes, BW, latency)
    assert t >= allreduce_lower_bound_time(n, nbytes, BW) * (1 - 1e-12)
    assert t >= math.ceil(math.log2(n)) * latency * (1 - 1e-12)


@pytest.mark.parametrize("name", sorted(ALLREDUCE_COST_MODELS))
def test_one_gpu_needs_no_time_in_any_model(name):
    assert ALLREDUCE_COST_MODELS[name](1, 1e9, BW, ALPHA) == 0.0


def test_ring_reaches_the_bandwidth_lower_bound_without_latency():
    assert ring_allreduce_time(8, 1e9, BW, 0.0) == pytest.approx(allreduce_lower_bound_time(8, 1e9, BW))


def test_ring_wins_large_buffers_trees_win_small_ones_at_scale():
    # The trade-off NCCL 2.4 introduced double binary trees for (Jeaugey, NVIDIA blog 2019).
    assert ring_allreduce_time(8, 1e9, BW, ALPHA) < double_binary_tree_allreduce_time(8, 1e9, BW, ALPHA)
    assert double_binary_tree_allreduce_time(1024, 1e6, BW, ALPHA) < ring_allreduce_time(1024, 1e6, BW, ALPHA) / 10


def test_in_network_allreduce_formula_by_hand():
    # one latency up to the switch, one down; the buffer crosses each direction of the link once
    assert in_network_allreduce_time(8, 1e9, 100e9, 5e-6) == pytest.approx(10e-6 + 0.01)
    assert in_network_allreduce_time(1, 1e9, 100e9, 5e-6) == 0.0


@given(n=st.integers(2, 4096), nbytes=st.floats(1, 1e11))
def test_switch_additions_beat_the_gpu_lower_bound_by_2_n_minus_1_over_n(n, nbytes):
    # The bound 2(n-1)/n M/B holds only when GPUs add; with the switch adding each GPU moves M each way,
    # so the speed-up is the all-reduce bus-bandwidth factor 2(n-1)/n, which NCCL's tuning model applies
    # to NVLS (a busbw twice the link's as n grows).
    ratio = allreduce_lower_bound_time(n, nbytes, BW) / in_network_allreduce_time(n, nbytes, BW, 0.0)
    assert ratio == pytest.approx(2 * (n - 1) / n)
    if n > 2:
        assert in_network_allreduce_time(n, nbytes, BW, 0.0) < allreduce_lower_bound_time(n, nbytes, BW)


@pytest.mark.parametrize("call", [
    lambda: in_network_allreduce_time(0, 1e9, BW, ALPHA),
    lambda: in_network_allreduce_time(8, 1e9, BW, -1.0),
    lambda: tree_allreduce_time(0, 1e9, BW, ALPHA),
    lambda: naive_allreduce_time(8, -1, BW, ALPHA),
    lambda: direct_allreduce_time(8, 1e9, 0, ALPHA),
    lambda: double_binary_tree_allreduce_time(8, 1e9, BW, -1e-6),
    lambda: double_binary_tree_allreduce_time(8, 1e9, BW, ALPHA, blocks=0.5),
    lambda: allreduce_lower_bound_time(8, 1e9, 0),
    lambda: hierarchical_allreduce_time(-1, 8, 2, 1, 0, 1, 0),
    lambda: hierarchical_allreduce_time(1, 8, 2, 0, 0, 1, 0),
    lambda: hierarchical_allreduce_time(1, 8, 2, 1, -1, 1, 0),
    lambda: flat_ring_allreduce_time(1, 8, 2, 1, 0, 1, 0, rings=9),
    lambda: flat_ring_allreduce_time(1, 0, 2, 1, 0, 1, 0),
])
def test_bad_collective_input_raises(call):
    with pytest.raises(ValueError):
        call()


# --- two-level all-reduce ----------------------------------------------------

H100 = dict(intra_bandwidth=450e9, intra_latency=0.0, inter_bandwidth=50e9, inter_latency=0.0)


def test_hierarchical_formula_by_hand():
    # 8 GPUs per node, 32 nodes, 1 GB: 2*7/8 * 1e9 / 450e9 + 2*31/32 * (1e9/8) / 50e9
    t = hierarchical_allreduce_time(1e9, 8, 32, **H100)
    assert t == pytest.approx(1.75 / 450 + 2 * 31 / 32 * 0.125 / 50)


def test_hierarchical_reduces_to_one_level():
    assert hierarchical_allreduce_time(1e9, 8, 1, 450e9, 2e-6, 50e9, 5e-6) == pytest.approx(
        ring_allreduce_time(8, 1e9, 450e9, 2e-6))
    assert hierarchical_allreduce_time(1e9, 1, 16, 450e9, 2e-6, 50e9, 5e-6) == pytest.approx(
        ring_allreduce_time(16, 1e9, 50e9, 5e-6))


def test_flat_single_ring_is_paced_by_the_slow_link():
    assert flat_ring_allreduce_time(1e9, 8, 32, 450e9, 2e-6, 50e9, 5e-6) == pytest.approx(
        ring_allreduce_time(256, 1e9, 50e9, 5e-6))
    assert flat_ring_allreduce_time(1e9, 8, 1, 450e9, 2e-6, 50e9, 5e-6, rings=8) == pytest.approx(
        ring_allreduce_time(8, 1e9, 450e9, 2e-6))
    # eight rings, one per NIC: each carries 1/8 of the data over its own 50 GB/s link
    assert flat_ring_allreduce_time(1e9, 8, 32, **H100, rings=8) == pytest.approx(
        ring_allreduce_time(256, 1e9 / 8, 50e9, 0.0))


@given(st.integers(2, 16), st.integers(2, 512), st.floats(1e3, 1e11),
       st.floats(1e9, 1e12), st.floats(0, 1e-5), st.floats(0.05, 1.0), st.floats(1.0, 10.0))
def test_hierarchical_never_slower_than_one_flat_ring_when_inside_is_faster(
        g, nodes, nbytes, intra_bw, intra_lat, bw_ratio, lat_ratio):
    args = (nbytes, g, nodes, intra_bw, intra_lat, intra_bw * bw_ratio, intra_lat * lat_ratio)
    assert hierarchical_allreduce_time(*args) <= flat_ring_allreduce_time(*args) * (1 + 1e-9)
