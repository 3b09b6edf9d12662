"""utils.parallel.data.overlap: the invariants of the DDP overlap timeline.

Its bucketing rule, utils.parallel.data.data_parallel.plan_buckets, is tested against PyTorch in test_data_parallel.py.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from utils.parallel.comm.network import ring_allreduce_time
from utils.parallel.data.overlap import ddp_timeline

seconds = st.floats(0, 1e-2, allow_nan=False)


@given(st.lists(st.tuples(seconds, st.integers(0, 10**6)), min_size=1, max_size=20),
       st.floats(1, 1e7), st.integers(1, 64), st.floats(1e6, 1e11), st.floats(0, 1e-4))
@settings(deadline=None)
def test_step_lies_between_max_and_sum_of_compute_and_comm(units, cap, n_gpus, bandwidth, latency):
    backward, nbytes = zip(*units)
    t = ddp_timeline(backward, nbytes, cap, n_gpus, bandwidth, latency)
    eps = 1e-12
    assert max(t.compute_seconds, t.comm_seconds) - eps <= t.step_seconds <= t.compute_seconds + t.comm_seconds + eps
    for prev, b in zip(t.buckets, t.buckets[1:]):
        assert b.start_seconds >= prev.end_seconds - eps  # one all-reduce at a time
    for b in t.buckets:
        assert b.start_seconds >= b.ready_seconds  # never before its gradients exist


@given(st.lists(st.tuples(seconds, st.integers(0, 10**6)), min_size=1, max_size=20), st.integers(2, 64))
def test_one_bucket_overlaps_nothing(units, n_gpus):
    backward, nbytes = zip(*units)
    t = ddp_timeline(backward, nbytes, float("inf"), n_gpus, 1e9, 1e-5)
    assert len(t.buckets) == 1
    expected = sum(backward) + ring_allreduce_time(n_gpus, sum(nbytes), 1e9, 1e-5)
    assert t.step_seconds == pytest.approx(expected, rel=1e-12, abs=1e-15)


@given(st.lists(st.tuples(seconds, st.integers(0, 10**6)), min_size=1, max_size=20), st.integers(1, 10**6))
def test_free_communication_costs_only_compute(units, cap):
    backward, nbytes = zip(*units)
    t = ddp_timeline(backward, nbytes, cap, 8, float("inf"), 0.0)
    assert t.step_seconds == pytest.approx(sum(backward), rel=1e-12, abs=1e-15)
    assert t.exposed_comm_seconds == pytest.approx(0.0, abs=1e-15)


def test_worked_example():
    # 4 equal layers of 1 ms backward and 100 MB of gradients, one bucket each, 8 GPUs at 100 GB/s, no latency:
    # each all-reduce takes 2 * 7/8 * 1e8 / 1e11 = 1.75 ms, so the link, not compute, sets the pace:
    # first bucket ready at 1 ms, then 4 all-reduces back to back: 1 + 4 * 1.75 = 8 ms.
    t = ddp_timeline([1e-3] * 4, [1e8] * 4, 1e8, 8, 1e11, 0.0)
    assert [b.units for b in t.buckets] == [(3,), (2,), (1,), (0,)]
    assert [round(b.start_seconds * 1e3, 6) for b in t.buckets] == [1.0, 2.75, 4.5, 6.25]
    assert t.step_seconds == pytest.approx(8e-3)
    assert t.grad_ready_seconds == pytest.approx((4e-3, 3e-3, 2e-3, 1e-3))


@pytest.mark.parametrize("args", [
    ([1.0], [1, 2], 10, 2, 1e9, 0.0),        # lengths differ
    ([-1.0, 1.0], [1, 2], 10, 2, 1e9, 0.0),  # negative compute
    ([1.0, 1.0], [1, 2], 10, 0, 1e9, 0.0),   # no GPUs
    ([1.0, 1.0], [1, 2], 10, 2, 0.0, 0.0),   # no bandwidth
    ([1.0, 1.0], [1, 2], 10, 2, 1e9, -1.0),  # negative latency
    ([], [], 10, 2, 1e9, 0.0),               # no units
    ([1.0, 1.0], [1, float("nan")], 10, 2, 1e9, 0.0),  # a size that is not a number
    ([1.0, 1.0], [1, 2], 0, 2, 1e9, 0.0),    # no bucket cap
])
def test_ddp_timeline_rejects_bad_input(args):
    with pytest.raises(ValueError):
        ddp_timeline(*args)


def test_a_given_allreduce_cost_model_prices_every_bucket():
    from utils.parallel.comm.network import flat_ring_allreduce_time

    def eight_rings(nbytes):  # two DGX H100 nodes, one ring per NIC
        return flat_ring_allreduce_time(nbytes, 8, 2, 450e9, 2e-6, 50e9, 5e-6, rings=8)

    t = ddp_timeline([1e-3] * 4, [1e8] * 4, float("inf"), 16, 50e9, 5e-6, allreduce_seconds=eight_rings)
    assert t.comm_seconds == pytest.approx(eight_rings(4e8))
    # one ring at one NIC's 50 GB/s is the default model, and far slower
    single = ddp_timeline([1e-3] * 4, [1e8] * 4, float("inf"), 16, 50e9, 5e-6)
    assert single.comm_seconds == pytest.approx(ring_allreduce_time(16, 4e8, 50e9, 5e-6))
    assert single.comm_seconds > 5 * t.comm_seconds
    with pytest.raises(ValueError):
        ddp_timeline([1e-3], [1e8], 1e9, 16, 50e9, 0.0, allreduce_seconds=lambda n: -1.0)


def test_min_tokens_to_hide_communication_by_hand_and_scaling_book():
    from utils.parallel.data.overlap import min_tokens_to_hide_communication as tokens

    # Austin et al., How to Scale Your Model, part 5: TPU v5p, C = 4.6e14, W = 2 * 9e10 -> "at least 2,550" (2,555.6)
    assert tokens(4.6e14, 2 * 9e10) == pytest.approx(2555.6, abs=0.1)
    assert tokens(4.6e14, 2 * 9e10, "fsdp") == pytest.approx(tokens(4.6e14, 2 * 9e10, "dp"))
    # by hand, H100 at the dense bf16 peak over one NIC: 989e12 / 50e9 = 19,780 tokens
    assert tokens(989e12, 50e9) == pytest.approx(19_780)
    # finite N: the ring sends 2(N-1)/N; 16 GPUs -> 15/16 of it
    assert tokens(989e12, 50e9, n_gpus=16) == pytest.approx(19_780 * 15 / 16)
    # fp32 elements double it; FSDP's 3 Psi over 6 P T FLOPs equals DP's 2 Psi over 4 P T
    assert tokens(1e12, 1e9, bytes_per_element=4) == pytest.approx(2000)
    assert tokens(1e12, 1e9, "fsdp", n_gpus=4) == pytest.approx(3 * 3 / 4 * 2 * 1e12 / (6 * 1e9))


def test_min_tokens_agrees_with_the_timeline():
    """At exactly the critical tokens (no latency), bucketed communication equals backward compute."""
    from utils.parallel.data.overlap import min_tokens_to_hide_communication as tokens

    flops, bandwidth, n, layers, params = 400e12, 50e9, 16, 24, 5e7
    t_min = tokens(flops, bandwidth, n_gpus=n)
    timeline = ddp_timeline([4 * params * t_min / flops] * layers, [2 * params] * layers, 2 * params, n,
                            bandwidth, 0.0)
    assert timeline.comm_seconds == pytest.approx(timeline.compute_seconds)


@pytest.mark.parametrize("args", [(0, 1e9), (1e12, 0), (1e12, 1e9, "tp"), (1e12, 1e9, "dp", 0),
                                  (1e12, 1e9, "dp", None, 0)])
def test_min_tokens_rejects_bad_input(args):
    from utils.parallel.data.overlap import min_tokens_to_hide_communication as tokens

    with pytest.raises(ValueError):
        tokens(*args)
