"""Tests of utils.production.slow_step: each planted problem is found in its trace, alone; the fixed step has none;
every variant computes the same training."""

from __future__ import annotations

import pytest
import torch

from utils.production import slow_step as ss
from utils.production.trace_timeline import TraceEvent


def _counts(problems, tmp_path, steps=4):
    torch._dynamo.reset()
    model, forward, optimizer = ss.build(seed=0, problems=problems)
    trim = "recompilation" in problems

    def step(i):
        return ss.planted_step(model, forward, optimizer, *ss.batch_for_step(i, trim=trim), problems)

    return ss.profile_steps(step, tmp_path / "trace.json", warmup=2, active=steps - 2)


@pytest.mark.parametrize("problem", ss.PROBLEMS)
def test_each_planted_problem_is_found_alone(problem, tmp_path):
    assert ss.find_problems(_counts((problem,), tmp_path)) == [problem]


def test_the_fixed_step_has_no_problem_and_all_four_are_found_together(tmp_path):
    clean = _counts((), tmp_path)
    assert ss.find_problems(clean) == []
    assert (clean.syncs, clean.compilations) == (0, 0)
    assert clean.optimizer_ops <= 3 and clean.loss_and_clip_ops < ss.LIMITS["loss_and_clip_ops"]
    assert ss.find_problems(_counts(ss.PROBLEMS, tmp_path)) == list(ss.PROBLEMS)


def test_every_variant_trains_to_the_same_weights():
    final = {}
    for problems in ((), ss.PROBLEMS, ("tiny kernels",), ("unfused optimizer",)):
        torch._dynamo.reset()
        model, forward, optimizer = ss.build(seed=0, problems=problems)
        log = []
        for i in range(4):
            ss.planted_step(model, forward, optimizer, *ss.batch_for_step(i, trim="recompilation" in problems),
                            problems, log)
        final[problems] = torch.cat([p.detach().flatten() for p in model.parameters()])
        assert len(log) == (4 if "host sync" in problems else 0)
    for problems, weights in final.items():
        torch.testing.assert_close(weights, final[()], rtol=1e-4, atol=1e-5, msg=f"{problems}")


def test_batches_pad_or_trim_and_their_lengths_change_every_step():
    widths = []
    for step in range(8):
        inputs, targets = ss.batch_for_step(step)
        assert inputs.shape == targets.shape == (ss.BATCH, ss.MAX_LEN - 1)
        trimmed, trimmed_targets = ss.batch_for_step(step, trim=True)
        width = trimmed.shape[1]
        assert torch.equal(trimmed, inputs[:, :width]) and torch.equal(trimmed_targets, targets[:, :width])
        assert (targets[:, width:] == ss.IGNORE).all() and (trimmed_targets[:, -1] != ss.IGNORE).any()
        widths.append(width)
    assert len(set(widths)) == 8


def test_trace_counts_reads_top_level_ops_in_the_ranges():
    def ev(name, cat, start, dur):
        return TraceEvent("cpu", name, cat, start, dur, 0, {})

    events = [ev("ProfilerStep#3", "user_annotation", 0, 100),
              ev("loss", "user_annotation", 0, 30), ev("aten::item", "cpu_op", 1, 2),
              ev("aten::_local_scalar_dense", "cpu_op", 1.5, 1), ev("aten::add", "cpu_op", 5, 2),
              ev("optimizer", "user_annotation", 40, 50), ev("aten::_fused_adamw_", "cpu_op", 41, 10),
              ev("aten::item", "cpu_op", 42, 1),  # inside the fused kernel: not top level, not a sync
              ev("aten::item", "cpu_op", 60, 1),  # AdamW's own read of a CPU step counter: not counted as a sync
              ev(ss.COMPILE_EVENT, "user_annotation", 91, 5), ev("aten::empty", "cpu_op", 92, 1),
              ev("aten::item", "cpu_op", 200, 1)]  # outside the profiled step
    counts = ss.trace_counts(events)
    assert counts == ss.StepCounts(steps=1, syncs=1, loss_and_clip_ops=2, optimizer_ops=2, compilations=1, ops=4)
    assert ss.find_problems(counts) == ["host sync", "recompilation"]
    assert [e.name for e in ss.top_level_ops(events)] == ["aten::item", "aten::add", "aten::_fused_adamw_",
                                                         "aten::item", "aten::empty", "aten::item"]
    with pytest.raises(ValueError, match="no ProfilerStep"):
        ss.trace_counts(events[1:])


def test_bad_input():
    with pytest.raises(ValueError, match="unknown problems"):
        ss.build(problems=("slow disk",))
    with pytest.raises(ValueError, match="step"):
        ss.batch_for_step(-1)
