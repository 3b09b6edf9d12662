"""utils.parallel.data.harness: N ranks must train the same model as one process on the full batch.

Multi-process tests run every strategy on gloo in one launch per world size,
and compare with :func:`train_single_process`.
"""

import math

import pytest
import torch

import torch.distributed.fsdp  # noqa: F401  (imported once here, so forked workers do not each import it)
from benchmarks import ddp_from_scratch, zero_and_fsdp
from utils.dist import launch
from utils.parallel.data import data_parallel as dp
from utils.parallel.data import harness
from utils.parallel.memory import zero_model_state_bytes

SGD = harness.TrainConfig(n_steps=4)
ADAM = harness.TrainConfig(n_steps=4, optimizer="adam", lr=0.01, batch_size=24)
# Adam divides by sqrt(v), so fp32 reordering of the gradient sum (1e-7 relative)
# can grow to a few 1e-6 in the weights after a few steps.
ADAM_TOL = dict(rtol=1e-4, atol=1e-5)


def _every_strategy(rank, world_size):
    out = {s: harness.train_data_parallel(rank, world_size, s, SGD) for s in ("naive", "bucketed", "torch_ddp")}
    out.update({s: harness.train_data_parallel(rank, world_size, s, ADAM) for s in ("zero1", "zero2", "fsdp2")})
    return out


@pytest.fixture(scope="module")
def two_ranks():
    return launch(_every_strategy, 2, timeout=120)


def _n_params(config):
    return sum(p.numel() for p in harness.make_mlp(config).parameters())


@pytest.mark.parametrize("strategy", ["naive", "bucketed", "torch_ddp"])
def test_data_parallel_sgd_matches_one_process_on_the_full_batch(two_ranks, strategy):
    ref = harness.train_single_process(SGD)
    for rank in (0, 1):
        torch.testing.assert_close(two_ranks[rank][strategy]["weights"], ref["weights"])
        assert two_ranks[rank][strategy]["losses"] == pytest.approx(ref["losses"], rel=1e-5)


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "fsdp2"])
def test_sharded_adam_matches_one_process_on_the_full_batch(two_ranks, strategy):
    ref = harness.train_single_process(ADAM)
    for rank in (0, 1):
        torch.testing.assert_close(two_ranks[rank][strategy]["weights"], ref["weights"], **ADAM_TOL)
        assert two_ranks[rank][strategy]["losses"] == pytest.approx(ref["losses"], rel=1e-5)
    # The run really trained: the weights moved away from their initial values.
    init = harness.make_mlp(ADAM).state_dict()
    assert max((init[k] - ref["weights"][k]).abs().max().item() for k in init) > 1e-3


def test_all_reduce_call_counts(two_ranks):
    params = list(harness.make_mlp(SGD).parameters())
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


def test_zero2_shards_gradients_and_adam_state_as_the_zero_formula_says(two_ranks):
    """Stage 2 (arXiv:1910.02054, Figure 1): gradients and optimizer state are 1/N_d per rank; here each parameter
    is split on its own, so the slices are ceil(numel / N) elements; at most one full gradient lives at once."""
    numels = [p.numel() for p in harness.make_mlp(ADAM).parameters()]
    slices = sum(math.ceil(n / 2) for n in numels)
    for rank in (0, 1):
        r = two_ranks[rank]["zero2"]
        assert r["grad_nbytes"] == 4 * slices < 4 * sum(numels)
        assert r["optimizer_state_nbytes"] == 8 * slices  # Adam: momentum and variance, fp32
        assert r["param_nbytes"] == 4 * sum(numels)  # stage 2 keeps the full weights
        assert r["full_grad_peak_nbytes"] == 4 * max(numels)


def _zero1_three_ranks(rank, world_size):
    return harness.train_data_parallel(rank, world_size, "zero1", ADAM)


def test_zero1_pads_when_the_parameters_do_not_split_evenly():
    psi = _n_params(ADAM)
    assert psi % 3 != 0  # so the last shard is padded
    out = launch(_zero1_three_ranks, 3, timeout=60)
    ref = harness.train_single_process(ADAM)
    for r in out:
        torch.testing.assert_close(r["weights"], ref["weights"], **ADAM_TOL)
        assert r["optimizer_state_nbytes"] == 8 * math.ceil(psi / 3)


def test_batch_shards_concatenate_to_the_batch():
    batch = torch.arange(12.0).reshape(6, 2)
    torch.testing.assert_close(torch.cat([harness.batch_shard(batch, r, 3) for r in range(3)]), batch)
    with pytest.raises(ValueError, match="does not split evenly"):
        harness.batch_shard(batch, 0, 4)


def test_make_mlp_is_seeded_and_leaves_the_global_generator_alone():
    state = torch.random.get_rng_state()
    a, b = harness.make_mlp(SGD), harness.make_mlp(SGD)
    assert torch.equal(torch.random.get_rng_state(), state)
    torch.testing.assert_close(a.state_dict(), b.state_dict())
    c = harness.make_mlp(harness.TrainConfig(seed=1))
    assert not torch.equal(a[0].weight, c[0].weight)


@pytest.mark.parametrize("call, match", [
    (lambda: harness.TrainConfig(batch_size=0), "batch_size"),
    (lambda: harness.TrainConfig(optimizer="lion"), "optimizer"),
    (lambda: harness.TrainConfig(lr=0.0), "lr"),
    (lambda: harness.train_data_parallel(0, 2, "pipeline"), "strategy"),
    (lambda: harness.batch_shard(torch.ones(4, 2), 2, 2), "rank"),
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
