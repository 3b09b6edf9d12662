"""utils.parallel.data.zero: ZeRO-2 refuses bad input and accumulates gradients over micro-batches like one process."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from utils.dist import launch
from utils.parallel.data import harness
from utils.parallel.data.data_parallel import broadcast_parameters
from utils.parallel.data.zero import ZeroTwoOptimizer

CONFIG = harness.TrainConfig(n_steps=2, optimizer="adam", lr=0.01, batch_size=24)


@pytest.mark.parametrize("params, match", [
    ([], "no parameters"),
    ([torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2, dtype=torch.float64))], "one dtype"),
])
def test_bad_input_raises_value_error(params, match):
    with pytest.raises(ValueError, match=match):
        ZeroTwoOptimizer(params)


def _two_micro_batches(rank, world_size, optimizer="adam"):
    """Each step: two half-batches, backward on each (the hooks accumulate the gradient slices), one step."""
    model = harness.make_mlp(CONFIG)
    broadcast_parameters(model)
    opt = ZeroTwoOptimizer(model.parameters(), torch.optim.SGD if optimizer == "sgd" else torch.optim.Adam,
                           lr=CONFIG.lr)
    x, y = harness.make_regression_data(CONFIG)
    for step in range(CONFIG.n_steps):
        rows = slice(step * CONFIG.batch_size, (step + 1) * CONFIG.batch_size)
        xs, ys = harness.batch_shard(x[rows], rank, world_size), harness.batch_shard(y[rows], rank, world_size)
        half = xs.shape[0] // 2
        for part in (slice(0, half), slice(half, None)):
            (F.mse_loss(model(xs[part]), ys[part]) / 2).backward()  # mean over the two halves
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# Adam's step hardly depends on the gradient's scale (m / sqrt(v)): a gradient summed over the ranks
# instead of averaged moves Adam's weights by about eps / sqrt(v), only ~3x this tolerance. Plain SGD's
# step is lr times the gradient, so the same slip doubles it.
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_gradient_accumulation_matches_one_process(optimizer):
    one = harness.train_single_process(dataclasses.replace(CONFIG, optimizer=optimizer))["weights"]
    for weights in launch(_two_micro_batches, 2, optimizer, timeout=60):
        torch.testing.assert_close(weights, one, rtol=1e-4, atol=1e-5)
