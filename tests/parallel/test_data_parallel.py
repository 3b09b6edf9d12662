"""utils.parallel.data_parallel: N ranks must train the same model as one process on the full batch.

Multi-process tests run every strategy on gloo in one launch per world size,
and compare with :func:`train_single_process`; pure helpers get property tests.
"""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import torch.distributed.fsdp  # noqa: F401  (imported once here, so forked workers do not each import it)
from benchmarks import ddp_from_scratch, zero_and_fsdp
from utils.parallel import data_parallel as dp
from utils.dist import launch
from utils.parallel.memory import zero_model_state_bytes

SGD = dp.TrainConfig(n_steps=4)
ADAM = dp.TrainConfig(n_steps=4, optimizer="adam", lr=0.01, batch_size=24)
# Adam divides by sqrt(v), so fp32 reordering of the gradient sum (1e-7 relative)
# can grow to a few 1e-6 in the weights after a few steps.
ADAM_TOL = dict(rtol=1e-4, atol=1e-5)


def _every_strategy(rank, world_size):
    out = {s: dp.train_data_parallel(rank, world_size, s, SGD) for s in ("naive", "bucketed", "torch_ddp")}
    out.update({s: dp.train_data_parallel(rank, world_size, s, ADAM) for s in ("zero1", "fsdp2")})
    return out


@pytest.fixture(scope="module")
def two_ranks():
    return launch(_every_strategy, 2, timeout=120)


def _n_params(config):
    return sum(p.numel() for p in dp.make_mlp(config).parameters())


@pytest.mark.parametrize("strategy", ["naive", "bucketed", "torch_ddp"])
def test_data_parallel_sgd_matches_one_process_on_the_full_batch(two_ranks, strategy):
    ref = dp.train_single_process(SGD)
    for rank in (0, 1):
        torch.testing.assert_close(two_ranks[rank][strategy]["weights"], ref["weights"])
        assert two_ranks[rank][strategy]["losses"] == pytest.approx(ref["losses"], rel=1e-5)


@pytest.mark.parametrize("strategy", ["zero1", "fsdp2"])
def test_sharded_adam_matches_one_process_on_the_full_batch(two_ranks, strategy):
    ref = dp.train_single_process(ADAM)
    for rank in (0, 1):
        torch.testing.assert_close(two_ranks[rank][strategy]["weights"], ref["weights"], **ADAM_TOL)
        assert two_ranks[rank][strategy]["losses"] == pytest.approx(ref["losses"], rel=1e-5)
    # The run really trained: the weights moved away from their initial values.
    init = dp.make_mlp(ADAM).state_dict()
    assert max((init[k] - ref["weights"][k]).abs().max().item() for k in init) > 1e-3


def test_all_reduce_call_counts(two_ranks):
    params = list(dp.make_mlp(SGD).parameters())
    assert two_ranks[0]["naive"]["n_all_reduce_calls"] == len(params) == 2 * SGD.n_layers
    plan = dp.plan_buckets([p.numel() * 4 for p in params], 2048)
    assert two_ranks[0]["bucketed"]["n_all_reduce_calls"] == len(plan) < len(params)


def test_zero1_shards_adam_state_as_the_zero_formula_says(two_ranks):
    # fp32 Adam keeps exp_avg and exp_avg_sq: K = 8 bytes per parameter. ZeRO-1 (arXiv:1910.02054,
    # Figure 1) divides that term by N_d; stage 1 minus the same with K = 0 isolates it.
    psi = _n_params(ADAM)
    assert psi % 2 == 0
    expected = zero_model_state_bytes(psi, 2, 1, 8) - zero_model_state_bytes(psi, 2, 1, 0)
    for rank in (0, 1):
        assert two_ranks[rank]["zero1"]["optimizer_state_nbytes"] == expected == 8 * psi / 2
        assert two_ranks[rank]["zero1"]["grad_nbytes"] == 4 * psi  # stage 1 keeps full gradients


def test_fsdp2_holds_one_nth_of_every_state(two_ranks):
    psi = _n_params(ADAM)
    ratio = zero_model_state_bytes(psi, 2, 3) / zero_model_state_bytes(psi, 2, 0)  # stage 3: all / N_d
    r = two_ranks[0]["fsdp2"]
    assert r["param_nbytes"] == 4 * psi * ratio
    assert r["grad_nbytes"] == 4 * psi * ratio
    assert r["optimizer_state_nbytes"] == 8 * psi * ratio


def _zero1_three_ranks(rank, world_size):
    return dp.train_data_parallel(rank, world_size, "zero1", ADAM)


def test_zero1_pads_when_the_parameters_do_not_split_evenly():
    psi = _n_params(ADAM)
    assert psi % 3 != 0  # so the last shard is padded
    out = launch(_zero1_three_ranks, 3, timeout=60)
    ref = dp.train_single_process(ADAM)
    for r in out:
        torch.testing.assert_close(r["weights"], ref["weights"], **ADAM_TOL)
        assert r["optimizer_state_nbytes"] == 8 * math.ceil(psi / 3)


def _bucket_calls_before_finish(rank, world_size):
    model = dp.make_mlp(SGD)
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


def test_batch_shards_concatenate_to_the_batch():
    batch = torch.arange(12.0).reshape(6, 2)
    torch.testing.assert_close(torch.cat([dp.batch_shard(batch, r, 3) for r in range(3)]), batch)
    with pytest.raises(ValueError, match="does not split evenly"):
        dp.batch_shard(batch, 0, 4)


def test_make_mlp_is_seeded_and_leaves_the_global_generator_alone():
    state = torch.random.get_rng_state()
    a, b = dp.make_mlp(SGD), dp.make_mlp(SGD)
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.testing.assert_close(a.state_dict(), b.state_dict())
    c = dp.make_mlp(dp.TrainConfig(seed=1))
    assert not torch.equal(a[0].weight, c[0].weight)


@pytest.mark.parametrize("call, match", [
    (lambda: dp.TrainConfig(batch_size=0), "batch_size"),
    (lambda: dp.TrainConfig(optimizer="lion"), "optimizer"),
    (lambda: dp.TrainConfig(lr=0.0), "lr"),
    (lambda: dp.train_data_parallel(0, 2, "pipeline"), "strategy"),
    (lambda: dp.plan_buckets([4, 4], 0), "bucket_cap_bytes"),
    (lambda: dp.shard_range(10, 2, 2), "rank"),
    (lambda: dp.ZeroOneOptimizer([]), "no parameters"),
    (lambda: dp.ZeroOneOptimizer([torch.nn.Parameter(torch.ones(2)),
                                  torch.nn.Parameter(torch.ones(2, dtype=torch.float64))]), "one dtype"),
])
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("script", [ddp_from_scratch, zero_and_fsdp])
def test_benchmark_scripts_check_every_strategy_on_gloo(script, capsys):
    script.main(["--world-size", "2", "--n-layers", "2", "--d-hidden", "8", "--steps", "2", "--batch-size", "8"])
    printed = capsys.readouterr().out
    assert printed.count("matches one process") == 3
    assert "say nothing about GPU speed" in printed
