"""utils.parallel.overlap: DDP's bucket rule (against PyTorch's reducer) and the invariants of the overlap timeline."""

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from utils.parallel.network import ring_allreduce_time
from utils.parallel.overlap import DDP_DEFAULTS, MIB, assign_buckets, ddp_timeline

sizes = st.lists(st.integers(0, 5000), min_size=1, max_size=30)
seconds = st.floats(0, 1e-2, allow_nan=False)


def _torch_buckets(grad_nbytes, limits):
    """PyTorch's own bucket assignment, called as DDP's reducer calls it when it rebuilds its buckets
    after the first iteration: fp32 tensors in the order their gradients became ready (backward
    order), with their parameter indices as labels."""
    order = list(reversed(range(len(grad_nbytes))))
    tensors = [torch.empty(grad_nbytes[i] // 4) for i in order]
    buckets, _ = dist._compute_bucket_assignment_by_size(tensors, limits, [False] * len(tensors), order)
    return buckets


@pytest.mark.skipif(not hasattr(dist, "_compute_bucket_assignment_by_size"),
                    reason="this torch build has no _compute_bucket_assignment_by_size (a private API)")
@given(st.lists(st.integers(0, 2000).map(lambda n: 4 * n), min_size=1, max_size=30),
       st.integers(1, 4000), st.integers(1, 4000))
@settings(max_examples=200, deadline=None)
def test_buckets_match_pytorchs_reducer(grad_nbytes, first_cap, cap):
    assert assign_buckets(grad_nbytes, cap, first_cap) == _torch_buckets(grad_nbytes, [first_cap, cap])
    assert assign_buckets(grad_nbytes, cap) == _torch_buckets(grad_nbytes, [cap])


def test_buckets_of_a_ddp_mlp_with_default_caps():
    # 8 Linear(512, 512) layers in fp32, as in the chapter: each layer's weight+bias is 1,050,624 bytes,
    # so the 1 MiB first bucket holds the last layer and the 25 MiB bucket holds the other seven.
    layer = [512 * 512 * 4, 512 * 4]
    grad_nbytes = layer * 8
    buckets = assign_buckets(grad_nbytes, DDP_DEFAULTS["bucket_cap_nbytes"], DDP_DEFAULTS["first_bucket_cap_nbytes"])
    assert [sum(grad_nbytes[i] for i in b) for b in buckets] == [1_050_624, 7_354_368]
    assert buckets[0] == [15, 14]


@given(sizes, st.integers(1, 10_000))
def test_buckets_partition_the_units_in_backward_order(grad_nbytes, cap):
    buckets = assign_buckets(grad_nbytes, cap)
    flat = [i for b in buckets for i in b]
    assert flat == list(reversed(range(len(grad_nbytes))))
    for b in buckets[:-1]:  # every closed bucket reached the cap, and not one gradient earlier
        assert sum(grad_nbytes[i] for i in b) >= cap
        assert sum(grad_nbytes[i] for i in b[:-1]) < cap


def test_infinite_cap_is_one_bucket():
    assert assign_buckets([10, 20, 30], float("inf")) == [[2, 1, 0]]


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


def test_ddp_defaults_are_pytorchs():
    from torch.nn.parallel import distributed

    assert DDP_DEFAULTS["bucket_cap_nbytes"] == distributed._DEFAULT_BUCKET_CAP_MB * MIB == 25 * MIB
    assert DDP_DEFAULTS["first_bucket_cap_nbytes"] == dist._DEFAULT_FIRST_BUCKET_BYTES


@pytest.mark.parametrize("kwargs", [
    dict(grad_nbytes=[]),
    dict(grad_nbytes=[1, -1]),
    dict(grad_nbytes=[1, float("nan")]),
    dict(grad_nbytes=[1, 2], bucket_cap_nbytes=0),
    dict(grad_nbytes=[1, 2], bucket_cap_nbytes=10, first_bucket_cap_nbytes=-1),
])
def test_assign_buckets_rejects_bad_input(kwargs):
    with pytest.raises(ValueError):
        assign_buckets(**kwargs)


@pytest.mark.parametrize("args", [
    ([1.0], [1, 2], 10, 2, 1e9, 0.0),        # lengths differ
    ([-1.0, 1.0], [1, 2], 10, 2, 1e9, 0.0),  # negative compute
    ([1.0, 1.0], [1, 2], 10, 0, 1e9, 0.0),   # no GPUs
    ([1.0, 1.0], [1, 2], 10, 2, 0.0, 0.0),   # no bandwidth
    ([1.0, 1.0], [1, 2], 10, 2, 1e9, -1.0),  # negative latency
])
def test_ddp_timeline_rejects_bad_input(args):
    with pytest.raises(ValueError):
        ddp_timeline(*args)
