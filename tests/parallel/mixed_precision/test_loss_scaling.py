"""utils.parallel.mixed_precision.loss_scaling across ranks: one inf/NaN verdict for every shard of a model.

The single-process scaler is checked against GradScaler in test_precision.py.
"""

import math

import pytest
import torch

from utils.dist import launch
from utils.parallel.mixed_precision.loss_scaling import DynamicLossScaler, found_inf_on_any_rank


def _verdicts(rank, world_size, pattern):
    # rank r found an inf at the steps where pattern[r] has an "i"
    return [found_inf_on_any_rank(kind == "i") for kind in pattern[rank]]


def test_every_rank_gets_the_or_of_the_verdicts():
    pattern = ["ffif", "fiff", "ffff"]
    got = launch(_verdicts, 3, pattern, backend="gloo", timeout=60)
    assert got == [[False, True, True, False]] * 3


def _train_shards(rank, world_size, sync):
    # each rank holds one shard of a model; rank 1's gradient overflows at step 1
    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = DynamicLossScaler(init_scale=2.0 ** 10, growth_interval=2)
    log = []
    for step in range(4):
        p.grad = torch.ones(4) * scaler.scale
        if rank == 1 and step == 1:
            p.grad[0] = math.inf
        found = scaler.unscale_([p])
        if sync:
            found = found_inf_on_any_rank(found)
        if not found:
            opt.step()
        scaler.update(found)
        log.append((found, scaler.scale, p.detach().clone()))
    return log


def test_without_the_all_reduce_the_shards_drift_apart():
    alone = launch(_train_shards, 2, False, backend="gloo", timeout=60)
    synced = launch(_train_shards, 2, True, backend="gloo", timeout=60)
    assert [s[0] for s in alone[0]] != [s[0] for s in alone[1]]  # rank 0 stepped where rank 1 skipped
    assert alone[0][-1][1] != alone[1][-1][1]                    # and their scales differ
    for a, b in zip(synced[0], synced[1]):
        assert a[0] == b[0] and a[1] == b[1]
        torch.testing.assert_close(a[2], b[2], rtol=0, atol=0)


def test_bad_input_raises():
    with pytest.raises(ValueError):
        found_inf_on_any_rank(1)
    with pytest.raises(ValueError):
        found_inf_on_any_rank(True)  # no process group in this process
