"""utils.parallel.data_parallel: gradient buckets from hooks, the bucketing rule, ZeRO-1's shards.

The training runs that check each strategy against one process are in test_harness.py.
"""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from utils.dist import launch
from utils.parallel import data_parallel as dp
from utils.parallel.harness import TrainConfig, make_mlp

SGD = TrainConfig(n_steps=4)


def _bucket_calls_before_finish(rank, world_size):
    model = make_mlp(SGD)
    ddp = dp.BucketedDDP(model, bucket_cap_bytes=4096)
    ddp(torch.randn(4, SGD.d_in)).pow(2).mean().backward()
    launched_during_backward = ddp.n_all_reduce_calls
    ddp.finish_gradient_synchronization()
    grads = [p.grad.clone() for p in model.parameters()]
    # Unused parameters never fire their hooks: finishing must say so, not hang or pass silently.
    model[0](torch.randn(4, SGD.d_in)).sum().backward()  # only the first layer takes part
    try:
        ddp.finish_gradient_synchronization()
        error = None
    except RuntimeError as exc:
        error = str(exc)
    return launched_during_backward, len(ddp.buckets), grads, error


def test_buckets_are_launched_from_hooks_during_backward():
    out = launch(_bucket_calls_before_finish, 2, timeout=60)
    launched, n_buckets, grads0, error = out[0]
    assert launched == n_buckets > 1
    torch.testing.assert_close(grads0, out[1][2])  # every rank holds the same averaged gradient
    assert error is not None and "received no gradient" in error


@given(st.lists(st.integers(0, 10_000), max_size=40), st.integers(1, 20_000))
def test_plan_buckets_covers_every_tensor_once_last_first_within_the_cap(nbytes, cap):
    plan = dp.plan_buckets(nbytes, cap)
    flat = [i for bucket in plan for i in bucket]
    assert flat == list(reversed(range(len(nbytes))))
    for bucket in plan:
        assert len(bucket) == 1 or sum(nbytes[i] for i in bucket) <= cap


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_shard_ranges_partition_the_flat_vector(numel, world_size):
    ranges = [dp.shard_range(numel, r, world_size) for r in range(world_size)]
    assert ranges[0][0] == 0 and ranges[-1][1] == numel
    for (_, stop), (start, _) in zip(ranges, ranges[1:]):
        assert stop == start
    assert all(stop - start <= math.ceil(numel / world_size) for start, stop in ranges)


@pytest.mark.parametrize("call, match", [
    (lambda: dp.plan_buckets([4, 4], 0), "bucket_cap_bytes"),
    (lambda: dp.shard_range(10, 2, 2), "rank"),
    (lambda: dp.ZeroOneOptimizer([]), "no parameters"),
    (lambda: dp.ZeroOneOptimizer([torch.nn.Parameter(torch.ones(2)),
                                  torch.nn.Parameter(torch.ones(2, dtype=torch.float64))]), "one dtype"),
])
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
