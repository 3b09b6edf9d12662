"""Tests of utils.capstone.assemble_check: the lab's checks pass the reference and name each planted mistake."""

from __future__ import annotations

import pytest
import torch.nn.functional as F

from utils.capstone import assemble_check as ac
from utils.capstone.parallel_4d import Pieces, local_tokens, loss_share
from utils.hints import CheckFailed
from utils.parallel.frontier.context_parallel import shard_sequence


def _contiguous_tokens(tokens, mesh, rank):
    at = mesh.coords(rank)
    mine = tokens.chunk(mesh.dp)[at["dp"]]
    return shard_sequence(mine, at["cp"], mesh.cp, "contiguous", dim=1).chunk(mesh.tp, dim=1)[at["tp"]]


def _mean_loss(logits, targets, mesh):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _no_finish(stage, zero, groups):
    pass


def test_the_reference_pieces_pass():
    ac.check_local_tokens(local_tokens)
    ac.check_loss_share(loss_share)


@pytest.mark.parametrize("check,fn,match", [
    (ac.check_local_tokens, _contiguous_tokens, "zig-zag chunks c and 2\\*cp - 1 - c"),
    (ac.check_local_tokens, lambda t, m, r: None, "returned None"),
    (ac.check_loss_share, _mean_loss, "off by tp"),
])
def test_a_planted_mistake_gets_its_hint(check, fn, match):
    with pytest.raises(CheckFailed, match=match):
        check(fn)


def test_training_check_passes_the_reference_and_names_a_missing_gradient_sum():
    losses, ref = ac.check_training(Pieces(), steps=2)
    assert losses == pytest.approx(ref, abs=1e-10, rel=0)
    with pytest.raises(CheckFailed, match="finish_gradients must sum the TP-replicated slices"):
        ac.check_training(Pieces(finish_gradients=_no_finish), steps=2)
