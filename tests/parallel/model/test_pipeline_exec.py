"""utils.parallel.model.pipeline_exec: a schedule run over send/recv gives one process's gradients (gloo, 2 and 4 ranks)."""

import pytest
import torch
from torch import nn

from utils.dist import launch
from utils.parallel.model import pipeline as pp
from utils.parallel.model.pipeline_exec import measured_bubble_fraction, run_schedule, split_layers

WIDTH, N_LAYERS, BATCH = 12, 8, 16


def _layers():
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(N_LAYERS)]


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)


def _worker(rank, world_size, kind, m, v):
    x, y = _data()
    return run_schedule(kind, split_layers(_layers(), world_size * v), x, y, m, v)


def _single_process_grads():
    model = nn.Sequential(*_layers())
    x, y = _data()
    nn.functional.mse_loss(model(x), y).backward()
    return [p.grad for p in model.parameters()], nn.functional.mse_loss(model(x), y).item()


@pytest.mark.parametrize("world_size,kind,m,v", [
    (2, "gpipe", 4, 1), (2, "1f1b", 4, 1), (2, "interleaved", 4, 2),
    (4, "gpipe", 8, 1), (4, "1f1b", 8, 1), (4, "interleaved", 4, 2),
])
def test_executed_pipeline_gradients_equal_one_process(world_size, kind, m, v):
    runs = launch(_worker, world_size, kind, m, v, timeout=90)
    pieces = split_layers(_layers(), world_size * v)
    got = [runs[k % world_size].grads[f"{k}.{name}"] for k in range(world_size * v)
           for name, _ in pieces[k].named_parameters()]
    reference, loss = _single_process_grads()
    torch.testing.assert_close(got, reference)
    assert sum(r.loss for r in runs) == pytest.approx(loss, rel=1e-5)  # only the last stage's rank has a loss
    # The executor stores what the schedule says it stores, and autograd's saved bytes follow.
    predicted = pp.peak_in_flight(pp.schedule(kind, world_size, m, v))
    assert [r.peak_in_flight for r in runs] == predicted
    for r, peak in zip(runs, predicted):
        assert r.peak_saved_nbytes <= peak * max(r.saved_nbytes_per_microbatch * 2, 1)
    assert 0.0 <= measured_bubble_fraction(runs) < 1.0


def test_1f1b_stores_fewer_activation_bytes_than_gpipe():
    gpipe = launch(_worker, 2, "gpipe", 8, 1, timeout=60)
    one_f_one_b = launch(_worker, 2, "1f1b", 8, 1, timeout=60)
    for a, b in zip(gpipe, one_f_one_b):
        assert a.saved_nbytes_per_microbatch == b.saved_nbytes_per_microbatch > 0
    assert gpipe[0].peak_saved_nbytes == 8 * gpipe[0].saved_nbytes_per_microbatch
    assert one_f_one_b[0].peak_saved_nbytes == 2 * one_f_one_b[0].saved_nbytes_per_microbatch


def test_split_layers_and_piece_count_are_checked():
    assert [len(s) for s in split_layers(_layers(), 3)] == [3, 2, 3]
    with pytest.raises(ValueError, match="n_parts must be between 1"):
        split_layers(_layers(), 9)


def test_measured_bubble_fraction_by_hand():
    # GPipe on p = 2 stages, m = 2 micro-batches, forward and backward 1 s each: every rank is busy 4 s;
    # rank 1 ends its last backward at 5 s, rank 0 at 6 s. The makespan is the later end, so the bubble is
    # 1 - 8 / (2 * 6) = 1/3 = (p - 1) / (m + p - 1); the earlier end would give 1 - 8 / 10 = 0.2.
    from utils.parallel.model.pipeline_exec import StageRun
    runs = [StageRun(grads={}, loss=0.0, busy_seconds=4.0, end_seconds=6.0),
            StageRun(grads={}, loss=0.0, busy_seconds=4.0, end_seconds=5.0)]
    assert measured_bubble_fraction(runs) == pytest.approx(1 / 3)
    assert measured_bubble_fraction(runs[::-1]) == pytest.approx(1 / 3)
