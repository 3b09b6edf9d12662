"""Tests of utils.capstone.parallel_4d: every 4D layout trains exactly as one process does."""

from __future__ import annotations

import functools

import pytest
import torch

from utils.attention.llama import LlamaConfig
from utils.capstone.mesh import Mesh
from utils.capstone.parallel_4d import (
    CONFIG, MICROBATCHES, check_layout, local_tokens, make_batch, reference_losses, step_traffic, train, train_losses,
)

LAYOUTS = [(2, 2, 2, 1), (2, 1, 2, 2), (1, 2, 2, 2), (2, 2, 1, 2)]


@functools.lru_cache(maxsize=None)
def _reference(dtype=torch.float64):
    return reference_losses(steps=4, seed=0, dtype=dtype)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: "dp%d-tp%d-pp%d-cp%d" % lay)
def test_layout_equals_one_process_in_fp64(layout):
    """Losses of 4 Adam steps and every final parameter equal one process's to 1e-10 (they agree to ~1e-14:
    only the order of sums differs)."""
    ref_losses, ref_params = _reference()
    losses, params = train(*layout, steps=4)
    assert losses == pytest.approx(ref_losses, abs=1e-10, rel=0)
    assert ref_losses[-1] < ref_losses[0] - 0.3, "the model should learn something in 4 steps"
    assert params.keys() == ref_params.keys()
    for name, p in ref_params.items():
        torch.testing.assert_close(params[name], p, rtol=0, atol=1e-10, msg=name)


def test_one_process_layout_is_the_reference():
    assert train_losses(1, 1, 1, 1) == pytest.approx(_reference()[0], abs=1e-12, rel=0)


def test_fp32_layout_agrees_within_stated_tolerance():
    """fp32: sums in another order move the losses by about 1e-7 relative; 1e-5 is the bound."""
    ref_losses, _ = _reference(torch.float32)
    assert train_losses(2, 2, 2, 1, dtype=torch.float32) == pytest.approx(ref_losses, rel=1e-5)


def test_every_token_lands_on_exactly_one_rank_of_each_tensor_pipeline_copy():
    mesh = Mesh(dp=2, tp=2, pp=2, cp=2)
    inputs, _ = make_batch(0)
    marked = torch.arange(inputs.numel()).view_as(inputs)
    for pp in range(mesh.pp):
        seen = torch.cat([local_tokens(marked, mesh, r).flatten() for r in range(mesh.world_size)
                          if mesh.coords(r)["pp"] == pp])
        assert sorted(seen.tolist()) == list(range(inputs.numel()))


@pytest.mark.parametrize("layout,match", [
    ((1, 4, 1, 1), "tp=4 must divide n_kv_heads"),
    ((1, 3, 1, 1), "tp=3 must divide n_heads"),
    ((1, 1, 5, 1), "pp=5 pipeline stages need at least 5 layers"),
    ((1, 1, 1, 3), "2\\*cp = 6 zig-zag chunks"),
    ((8, 1, 1, 1), "batch=8 must split into dp=8 x microbatches=2"),
    ((0, 1, 1, 1), "dp"),
])
def test_bad_layouts_are_refused(layout, match):
    with pytest.raises(ValueError, match=match):
        check_layout(*layout)
    with pytest.raises(ValueError, match=match):
        train_losses(*layout)


def test_a_context_share_that_sequence_parallelism_cannot_split_is_refused():
    config = LlamaConfig(n_heads=4, n_kv_heads=4)
    with pytest.raises(ValueError, match="context share of 6 tokens over tp=4"):
        check_layout(1, 4, 1, 1, config=config, seq_len=6)


@functools.lru_cache(maxsize=None)
def _traffic():
    return step_traffic(2, 2, 2, 2)


@pytest.mark.parametrize("rank", [0, 15])
def test_measured_traffic_matches_part_2s_formulas_and_each_difference_is_named(rank):
    """Per rank and step on (2, 2, 2, 2), fp64: sequence parallelism's all-gathers (with backward's re-gathers) and
    reduce-scatters, the pipeline's sends and ZeRO's parameter all-gather are exactly part 2's formulas; three
    differences are what the chapter says they are."""
    rows = {(r.group, r.op): r for r in _traffic()[rank]}
    for key in [("tp", "all-gather"), ("tp", "reduce-scatter"), ("pp", "send"), ("cp+dp", "all-gather")]:
        assert rows[key].measured == pytest.approx(rows[key].predicted, rel=1e-12), key
    # ring attention sends each block's dK/dV accumulator cp times (the last hop brings it home), the formula cp - 1:
    # per layer and micro-batch (cp - 1) * 3 blocks + 1 against (cp - 1) * 3, with cp = 2
    assert rows[("cp", "send")].ratio == pytest.approx(4 / 3, rel=1e-12)
    # ZeRO-2's hooks reduce-scatter every micro-batch's gradients; the planner counts one reduction per step
    assert rows[("cp+dp", "reduce-scatter")].ratio == pytest.approx(MICROBATCHES, rel=1e-12)
    # not in the formulas: the TP-replicated parameters' gradient slices (1/4 of them on each of the 4 data x context
    # ranks) summed over the 2 tensor ranks, and the loss (one fp64 value) summed over the world
    d = CONFIG.dim
    replicated = 2 * d * 2 + (CONFIG.vocab * d if rank == 0 else CONFIG.vocab * d + d)
    assert rows[("tp", "all-reduce")].measured == pytest.approx(2 * (1 / 2) * replicated / 4 * 8, rel=1e-12)
    assert rows[("world", "all-reduce")].calls == 1
    assert set(rows) == {("tp", "all-gather"), ("tp", "reduce-scatter"), ("tp", "all-reduce"), ("pp", "send"),
                         ("cp", "send"), ("cp+dp", "all-gather"), ("cp+dp", "reduce-scatter"), ("world", "all-reduce")}
