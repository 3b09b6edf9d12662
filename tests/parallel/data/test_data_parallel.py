"""utils.parallel.data.data_parallel: gradient buckets from hooks, the bucketing rule, ZeRO-1's shards.

The training runs that check each strategy against one process are in test_harness.py.
"""

import math

import pytest
import torch
import torch.distributed
from hypothesis import given, settings
from hypothesis import strategies as st

from utils.dist import launch
from utils.parallel.data import data_parallel as dp
from utils.parallel.data.harness import TrainConfig, make_mlp

SGD = TrainConfig(n_steps=4)
needs_private_api = pytest.mark.skipif(not hasattr(torch.distributed, "_compute_bucket_assignment_by_size"),
                                       reason="this torch build has no _compute_bucket_assignment_by_size (private)")


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


# --- the bucketing rule, against PyTorch's reducer -------------------------------------------------


def _torch_buckets(tensors, limits):
    """PyTorch's own bucket assignment, called as DDP's reducer calls it when it rebuilds its buckets after
    the first iteration: the tensors in the order their gradients became ready (backward order), labelled
    with their parameter indices."""
    order = list(reversed(range(len(tensors))))
    buckets, _ = torch.distributed._compute_bucket_assignment_by_size(
        [tensors[i] for i in order], limits, [False] * len(tensors), order)
    return buckets


def _nbytes(tensors):
    return [t.numel() * t.element_size() for t in tensors]


def _params(*modules):
    return [p.detach() for m in modules for p in m.parameters()]


MODELS = {
    "MLP of the harness": _params(make_mlp(SGD)),
    "8 x Linear(512, 512)": _params(*[torch.nn.Linear(512, 512) for _ in range(8)]),
    "a transformer block, d = 256": _params(torch.nn.TransformerEncoderLayer(256, 4, 1024)),
    "embedding, 2 blocks, head": _params(torch.nn.Embedding(1000, 128),
                                         *[torch.nn.TransformerEncoderLayer(128, 4, 512) for _ in range(2)],
                                         torch.nn.Linear(128, 1000)),
    "one huge tensor among small ones": [torch.empty(10), torch.empty(2**19), torch.empty(10), torch.empty(3)],
}
TORCH_DEFAULT_LIMITS = [getattr(torch.distributed, "_DEFAULT_FIRST_BUCKET_BYTES", 2**20),
                        getattr(torch.nn.parallel.distributed, "_DEFAULT_BUCKET_CAP_MB", 25) * 2**20]
CAPS = [  # (bucket_cap_bytes, first_bucket_cap_bytes) as plan_buckets takes them, and DDP's limits list
    ((None, None), TORCH_DEFAULT_LIMITS),
    ((4096, None), [4096]),
    ((2**20, None), [2**20]),
    ((2**20, 2**16), [2**16, 2**20]),
    ((1, None), [1]),
]


@needs_private_api
@pytest.mark.parametrize("caps, limits", CAPS, ids=lambda c: str(c))
@pytest.mark.parametrize("name", MODELS)
def test_plan_buckets_is_pytorchs_rule_on_real_models(name, caps, limits):
    tensors = MODELS[name]
    assert dp.plan_buckets(_nbytes(tensors), *caps) == _torch_buckets(tensors, limits)


@needs_private_api
@given(st.lists(st.integers(0, 2000), min_size=1, max_size=30), st.integers(1, 4000), st.integers(1, 4000),
       st.sampled_from([torch.float32, torch.float16, torch.float64]))
@settings(max_examples=200, deadline=None)
def test_plan_buckets_is_pytorchs_rule_on_random_sizes(numels, first_cap, cap, dtype):
    tensors = [torch.empty(n, dtype=dtype) for n in numels]
    assert dp.plan_buckets(_nbytes(tensors), cap, first_cap) == _torch_buckets(tensors, [first_cap, cap])
    assert dp.plan_buckets(_nbytes(tensors), cap) == _torch_buckets(tensors, [cap])


def test_ddp_defaults_are_pytorchs():
    from torch.nn.parallel import distributed

    if not hasattr(distributed, "_DEFAULT_BUCKET_CAP_MB"):  # torch 2.11 (GPU machine) writes 25 inline
        pytest.skip("this torch does not name its default bucket cap")
    assert dp.DDP_DEFAULTS["bucket_cap_nbytes"] == distributed._DEFAULT_BUCKET_CAP_MB * dp.MIB == 25 * dp.MIB
    assert dp.DDP_DEFAULTS["first_bucket_cap_nbytes"] == torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


def test_buckets_of_eight_linear_layers_with_ddps_default_caps():
    # Each Linear(512, 512) has 1,050,624 bytes of fp32 gradient (weight and bias): the 1 MiB first bucket
    # holds the last layer, the 25 MiB bucket the other seven.
    nbytes = _nbytes(MODELS["8 x Linear(512, 512)"])
    buckets = dp.plan_buckets(nbytes)
    assert [sum(nbytes[i] for i in b) for b in buckets] == [1_050_624, 7_354_368]
    assert buckets[0] == [15, 14]


@given(st.lists(st.integers(0, 5000), max_size=30), st.integers(1, 10_000))
def test_buckets_partition_the_tensors_in_backward_order_and_close_at_the_cap(nbytes, cap):
    buckets = dp.plan_buckets(nbytes, cap)
    assert [i for b in buckets for i in b] == list(reversed(range(len(nbytes))))
    for b in buckets[:-1]:  # every closed bucket reached the cap, and not one tensor earlier
        assert sum(nbytes[i] for i in b) >= cap
        assert sum(nbytes[i] for i in b[:-1]) < cap


def test_an_infinite_cap_is_one_bucket():
    assert dp.plan_buckets([10, 20, 30], float("inf")) == [[2, 1, 0]]
    assert dp.plan_buckets([], 100) == []


def _ddp_rebuilt_buckets(rank, world_size, cap_mb):
    ddp = torch.nn.parallel.DistributedDataParallel(make_mlp(WIDE), bucket_cap_mb=cap_mb)
    for _ in range(3):  # DDP rebuilds its buckets in gradient-arrival order after the first iteration
        ddp(torch.randn(4, WIDE.d_in)).sum().backward()
    data = ddp._get_ddp_logging_data()
    return [[int(i) for i in b.split()] for b in data["rebuilt_per_bucket_param_indices"].split(",")]


WIDE = TrainConfig(d_in=64, d_hidden=256, n_layers=6)


@pytest.mark.parametrize("cap_mb", [None, 0.25])
def test_plan_buckets_matches_the_buckets_ddp_builds(cap_mb):
    ddp_buckets = launch(_ddp_rebuilt_buckets, 2, cap_mb, timeout=120)[0]
    nbytes = _nbytes(_params(make_mlp(WIDE)))
    ours = dp.plan_buckets(nbytes) if cap_mb is None else dp.plan_buckets(nbytes, cap_mb * dp.MIB)
    assert ours == ddp_buckets and len(ours) > 1


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


def _zero1_sgd_step_by_hand(rank, world_size):
    a = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
    b = torch.nn.Parameter(torch.tensor([10.0, 20.0]))
    opt = dp.ZeroOneOptimizer([a, b], torch.optim.SGD, lr=0.25)
    a.grad = torch.full((3,), 2.0 * rank + 1)  # rank 0: 1, rank 1: 3; the average is 2
    b.grad = torch.full((2,), 2.0 * rank + 1)
    opt.step()
    return a.detach().clone(), b.detach().clone(), opt.shard.numel()


def test_zero1_steps_on_the_average_of_the_ranks_gradients():
    # 5 elements over 2 ranks: shards of ceil(5 / 2) = 3 (rank 1's last one is padding). The gradients
    # 1 and 3 average to 2, so SGD at lr 0.25 moves every weight by -0.5; a sum instead of an
    # average would move it by -1 (and Adam, scale-free, would hide that).
    for a, b, shard_numel in launch(_zero1_sgd_step_by_hand, 2, timeout=60):
        assert shard_numel == 3
        torch.testing.assert_close(a, torch.tensor([0.5, 1.5, 2.5]))
        torch.testing.assert_close(b, torch.tensor([9.5, 19.5]))
