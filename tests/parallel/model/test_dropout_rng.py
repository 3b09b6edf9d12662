"""utils.parallel.model.dropout_rng on 2 gloo ranks: the same dropout mask outside the parallel region, different inside."""

import pytest
import torch
import torch.nn.functional as F

from utils.dist import launch
from utils.parallel.model.dropout_rng import RNGStatesTracker, model_parallel_manual_seed


def _masks(rank, t):
    tracker = model_parallel_manual_seed(1234, rank)
    ones = torch.ones(64)
    replicated = F.dropout(ones, 0.5)  # the residual stream's dropout: the default stream
    with tracker.fork():
        first = F.dropout(ones, 0.5)  # this rank's heads: the tracked stream
    after = F.dropout(ones, 0.5)  # the default stream resumed where it was, untouched by the fork
    with tracker.fork():
        second = F.dropout(ones, 0.5)
    return replicated, first, after, second


def test_replicated_masks_agree_and_model_parallel_masks_differ():
    (rep0, mp0, after0, second0), (rep1, mp1, after1, second1) = launch(_masks, 2, timeout=60)
    assert torch.equal(rep0, rep1) and torch.equal(after0, after1)
    assert not torch.equal(mp0, mp1)
    torch.manual_seed(1234)
    expected = [F.dropout(torch.ones(64), 0.5) for _ in range(2)]
    assert torch.equal(rep0, expected[0]) and torch.equal(after0, expected[1])  # the fork consumed nothing here
    generator = torch.Generator().manual_seed(1234 + 2718)
    torch.set_rng_state(generator.get_state())
    assert torch.equal(mp0, F.dropout(torch.ones(64), 0.5)) and torch.equal(second0, F.dropout(torch.ones(64), 0.5))


def test_bad_names_and_ranks_raise():
    tracker = RNGStatesTracker()
    tracker.add("a", 1)
    with pytest.raises(ValueError, match="already exists"):
        tracker.add("a", 2)
    with pytest.raises(ValueError, match="unknown RNG state"):
        with tracker.fork("b"):
            pass
    with pytest.raises(ValueError, match="tp_rank"):
        model_parallel_manual_seed(0, -1)
