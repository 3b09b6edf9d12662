"""Tests of utils.capstone.engine_4d: PyTorch's FSDP2, DTensor TP+SP and pipelining train as the book's own parts do."""

from __future__ import annotations

import pytest

from utils.capstone.engine_4d import engine_run
from utils.capstone.parallel_4d import make_model, train_losses


def test_engines_agree_with_the_books_4d_step_on_dp2_tp2_pp2():
    """fp64, 8 gloo ranks, 4 Adam steps: the engines' losses equal the book's (2, 2, 2, 1) run to 1e-10 (both are
    one process's up to the order of sums), and each rank really holds 1/8 of the blocks' values."""
    ranks = engine_run(2, 2, 2)
    ours = train_losses(2, 2, 2, 1)
    for r in ranks:
        assert r["losses"] == pytest.approx(ours, abs=1e-10, rel=0)
    assert [r["layers"] for r in ranks] == [[0, 1]] * 2 + [[2, 3]] * 2 + [[0, 1]] * 2 + [[2, 3]] * 2
    model = make_model()
    per_stage = sum(p.numel() for b in model.blocks[:2] for p in b.parameters()) + model.embed.weight.numel()
    norms = 2 * 2 * model.config.dim  # SequenceParallel keeps the norm weights whole on each tensor rank
    # FSDP2 pads a dim-0 shard when dp does not divide it; the sizes here divide, so the shares are exact
    assert ranks[0]["local_numel"] == (per_stage - norms) // 4 + norms // 2
