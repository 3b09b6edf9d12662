"""The scorecard (issue 33): every prediction recomputed, each calculator's holdout errors pinned.

When a calculator changes, a pin below fails: update it in the same commit as
the change, with the before and after in the commit message. When a row is
added, update its calculator's count and pins.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

import utils.gpu.hardware as hardware
import utils.parallel.comm.nccl_allreduce as nccl_allreduce
import utils.parallel.comm.topology as topology
import utils.parallel.memory as memory
import utils.parallel.model.recompute_flops as recompute_flops
import utils.parallel.planning.planner as planner
import utils.parallel.training as training
import utils.rl.rlhf_cost as rlhf_cost
import utils.rl.rollout_systems as rollout_systems
import utils.serving.costs.calibrated as calibrated
import utils.serving.costs.step_time as step_time
import utils.serving.many_gpus.published_deployments as published_deployments
from utils import scorecard
from utils.parallel.planning.published_runs import MEGATRON_RUNS, fit_efficiency
from utils.published import Published
from utils.scorecard import serving as serving_rows
from utils.scorecard import BOUNDS, CALCULATORS, SPLITS, Entry, Record, rows, summary

TOLERANCE = 5e-4
"""Absolute tolerance on a pinned error (0.05 percentage points): the rows are arithmetic, identical on every
machine to far better than this; a change of a calculator moves its pins by more."""

PINNED = {  # calculator: (holdout rows, median |error|, worst |error|, signed median)
    # planner, issue 33 cause 1 (DP traffic): (21, 0.2522, 0.6482, -0.2474) at first; NCCL's one ring per NIC
    # (COMPUTE_EFFICIENCY refitted 0.54 -> 0.53): (21, 0.1881, 0.3889, -0.1437); DP overlapping compute (refitted
    # 0.53 -> 0.52): below. planner_5d moves with the refit only: (2, 0.0430, 0.0679, +0.0249) -> (2, 0.0418,
    # 0.0486, +0.0068) -> below.
    "planner": (21, 0.1417, 0.4720, -0.0527),
    "planner_5d": (2, 0.0319, 0.0344, -0.0026),
    "planner_memory": (4, 0.2297, 0.3027, +0.2297),
    "activation_memory": (5, 0.0047, 0.0824, +0.0025),
    "recompute_flops": (2, 0.0126, 0.0226, +0.0100),
    # collectives: (13, 0.6321, 2.2343, +0.6321) with the ideal ring and in-network models (2 us per step, the
    # line rate); NCCL's calibrated all-reduce (link efficiencies fitted on H100, base latency on the A100 32 KiB
    # row, which moves to fit): (12, 0.0798, 0.9997, +0.0622); below, with the protocol NCCL's tuning model picks
    # by size (LL, LL128, Simple). The worst row (A100 1 MiB) falls from +100 % to +75 % and every mid-size row
    # improves, but the median rises: H200's 1 MiB row now pays LL's latency and half bandwidth (-5 % -> -14 %).
    "collectives": (12, 0.1118, 0.7520, +0.0573),
    "network_topology": (9, 0.0000, 0.0000, +0.0000),
    "deployment": (7, 1.1252, 1.6888, +1.1252),
    # step_time: (19, 1.2579, 4.1736, +1.2579) with TensorRT-LLM 0.5/0.6's tables alone; below, with the 40 rows of
    # TensorRT-LLM 1.0's perf overview and NIM 1.8.0's 17, each held against the bound.
    "step_time": (76, 0.7013, 4.1736, +0.7013),
    # serving_calibrated: the bound over the fractions fitted on 11 rows (issue 33's target: median <= 25 %).
    "serving_calibrated": (65, 0.0961, 2.7329, +0.0769),
    # rlhf_cost: (4, 1.0935, 1.7305, +1.0935) with a ZeRO-3 trainer gathering 16 GB per micro-batch of one; below,
    # NeMo RL's Megatron trainer (PP 2, four optimizer steps, one gradient and parameter sync each): (4, 0.2350,
    # 0.5936, +0.1676); below, responses of the published mean length (a censored exponential), each decode step at
    # the serving scorecard's calibrated fraction of the roof. Every row is now too fast (issue 33's target, 25 %,
    # is not met: training efficiency and the colocated placement are what is left, section 4 of the page): (4,
    # 0.2729, 0.3567, -0.2729); below, with the recipes' activation checkpointing (8N per trained token) and per-row
    # trainer PP, and a fifth row, v0.5's FP8 run (the model prices it in BF16).
    "rlhf_cost": (5, 0.2806, 0.3374, -0.0509),
    "rlhf_flop_share": (1, 0.1667, 0.1667, -0.1667),
    "roofline_kernels": (33, 0.5860, 8.5081, +0.5860),
}
PINNED_FIT = {"planner": (10, 0.0683, 0.1837), "collectives": (3, 0.0034, 0.0041),
              "serving_calibrated": (11, 0.0314, 0.1974)}  # calculator: (fit rows, median |error|, worst |error|)
# planner fit rows (Megatron's Table 1): (10, 0.0394, 0.1292) at first, (10, 0.0518, 0.1938) after NCCL's rings,
# below after the overlap. The four PP = 1 rows (PyTorch DDP) no longer pay for DP traffic, so their in-sample
# optimism grew (+13% -> +18% at 1.7B) and the refit lowered the constant, which the large rows feel (-12% -> -15%
# at 1T).


@pytest.fixture(scope="module")
def records() -> list[Record]:
    return rows()


def _matches(pin: tuple, s: scorecard.CalculatorSummary) -> bool:
    n, median, worst, signed = pin
    return (s.n_holdout == n and abs(s.median_abs_error - median) < TOLERANCE
            and abs(s.worst_abs_error - worst) < TOLERANCE and abs(s.signed_median - signed) < TOLERANCE)


def test_every_calculator_is_pinned_and_has_rows(records):
    assert set(PINNED) == set(CALCULATORS) == {r.calculator for r in records}
    assert set(BOUNDS) <= set(CALCULATORS)


@pytest.mark.parametrize("calculator", CALCULATORS)
def test_holdout_errors_are_pinned(records, calculator):
    s = summary(records)[calculator]
    assert _matches(PINNED[calculator], s), (
        f"{calculator}: {s.n_holdout} holdout rows, median |error| {s.median_abs_error:.4f}, worst "
        f"{s.worst_abs_error:.4f} ({s.worst_run}), signed median {s.signed_median:+.4f}; pinned {PINNED[calculator]}. "
        "If a calculator or a row changed on purpose, update the pin in the same commit with its before and after.")
    fit = PINNED_FIT.get(calculator)
    if fit is None:
        assert s.n_fit == 0 and s.fit_median_abs_error is None
    else:
        assert s.n_fit == fit[0]
        assert abs(s.fit_median_abs_error - fit[1]) < TOLERANCE and abs(s.fit_worst_abs_error - fit[2]) < TOLERANCE


def test_issue_counts_per_calculator(records):
    """Issue 33's row targets: the RLHF cost model's five are NeMo RL's Llama 3.1 8B rows on H100 (the one model of
    its tables the cost model offers; the GB200 rows need a GPU the book's hardware table lacks)."""
    holdout = [r for r in records if r.split == "holdout"]
    assert len(holdout) >= 60
    count = {name: sum(r.calculator == name for r in holdout) for name in CALCULATORS}
    assert count["planner"] + count["planner_5d"] >= 20
    assert count["deployment"] + count["step_time"] >= 10
    assert count["serving_calibrated"] >= 10
    assert count["collectives"] >= 5
    assert count["rlhf_cost"] >= 5


def test_every_prediction_is_recomputed_and_consistent(records):
    again = rows()
    assert [r.run for r in again] == [r.run for r in records]
    for first, second in zip(records, again):
        assert first.predicted == second.predicted, first.run  # deterministic
        assert math.isfinite(first.predicted) and first.predicted > 0
        assert first.relative_error == pytest.approx(first.predicted / first.published - 1, rel=0, abs=1e-15)


def test_every_row_says_where_and_what(records):
    names = [(r.calculator, r.run) for r in records]
    assert len(names) == len(set(names)), "two rows of one calculator share a run name"
    for r in records:
        assert r.split in SPLITS, r.run
        assert len(r.source) > 30 and r.source.strip() == r.source, r.run
        assert r.inputs and all(isinstance(k, str) for k in r.inputs), r.run
        assert r.quantity and r.unit and len(r.omits) > 20, r.run
        with pytest.raises(TypeError):
            r.inputs["model"] = "changed"  # read-only


def test_fit_rows_are_the_rows_the_constant_was_fitted_on(records):
    """The planner's fit split is Megatron's Table 1, and refitting on exactly those rows gives the constant.
    The collectives' fit rows are the H100 plateaus (the two link efficiencies) and the A100 32 KiB row (the base
    latency), and the fitted constants reproduce them."""
    fit = [r for r in records if r.split == "fit"]
    assert {r.calculator for r in fit} == {"planner", "collectives", "serving_calibrated"}
    assert [r.run for r in fit if r.calculator == "planner"] == [run.name for run in MEGATRON_RUNS]
    assert round(fit_efficiency(MEGATRON_RUNS), 2) == planner.COMPUTE_EFFICIENCY
    collective_fit = [r for r in fit if r.calculator == "collectives"]
    assert sorted(r.run for r in collective_fit) == [
        "all-reduce of 32 KiB on 8 A100-SXM4-80GB, ring", "all-reduce of 4 GiB on 8 H100-SXM, NVLS",
        "all-reduce of 4 GiB on 8 H100-SXM, ring"]
    assert all(abs(r.relative_error) < 0.005 for r in collective_fit)
    assert nccl_allreduce.RING_LINK_EFFICIENCY == 370 / 450


def test_serving_fractions_are_refitted_from_their_fit_rows(records):
    """The calibrated serving model's fractions come from its 11 fit rows alone: TensorRT-LLM 1.0's Llama 3.1 8B
    column on one H100 (prefill and decode) and NIM's concurrency-1 ITL (latency-bound decode)."""
    fit = [r.run for r in records if r.calculator == "serving_calibrated" and r.split == "fit"]
    assert len(fit) == 11 and sum("Llama 3.1 8B FP8, H100-SXM" in run for run in fit) == 10
    assert sum(run.endswith("concurrency 1: ITL") for run in fit) == 1
    assert serving_rows.calibration_fit() == calibrated.ACHIEVED


def test_rows_filter_by_calculator(records):
    for name in ("planner", "rlhf_cost"):
        assert [r.run for r in rows(name)] == [r.run for r in records if r.calculator == name]


def _scaled(function, factor: float):
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs) * factor
    return wrapper


def _more_activations(function):
    def wrapper(seq_len, micro_batch, hidden, *args, **kwargs):
        return function(seq_len, micro_batch, hidden, *args, **kwargs) + seq_len * micro_batch * hidden
    return wrapper


def _more_stage_memory(function):
    def wrapper(*args, **kwargs):
        return {**function(*args, **kwargs), "extra": 5e9}
    return wrapper


def _patch(monkeypatch, calculator: str) -> None:
    """Break ``calculator`` the way a slip in its own code would (a constant, a term, a factor)."""
    if calculator in ("planner", "planner_5d"):
        monkeypatch.setattr(planner, "COMPUTE_EFFICIENCY", 0.6)
    elif calculator == "planner_memory":
        monkeypatch.setattr(planner, "stage_memory", _more_stage_memory(planner.stage_memory))
    elif calculator == "activation_memory":
        monkeypatch.setattr(memory, "activation_bytes_per_layer",
                            _more_activations(memory.activation_bytes_per_layer))
    elif calculator == "recompute_flops":
        monkeypatch.setattr(recompute_flops, "recompute_overhead", _scaled(recompute_flops.recompute_overhead, 3))
    elif calculator == "collectives":
        monkeypatch.setattr(nccl_allreduce, "nccl_allreduce_time", _scaled(nccl_allreduce.nccl_allreduce_time, 2))
    elif calculator == "network_topology":
        monkeypatch.setitem(topology.PUBLISHED, "quantum2_ports", Published(128, "ports per switch", "a slip"))
        monkeypatch.setattr(topology, "fat_tree_max_hosts", lambda radix, tiers: 2 * (radix // 2) ** (tiers - 1))
    elif calculator == "deployment":
        monkeypatch.setattr(published_deployments, "tokens_per_gpu_per_s",
                            _scaled(published_deployments.tokens_per_gpu_per_s, 0.5))
    elif calculator == "step_time":
        monkeypatch.setattr(step_time, "prefill_seconds", _scaled(step_time.prefill_seconds, 2))
    elif calculator == "serving_calibrated":
        monkeypatch.setattr(calibrated, "ACHIEVED", calibrated.Achieved(0.5, 0.5, 0.5))
    elif calculator == "rlhf_cost":
        for module in (rlhf_cost, rollout_systems):
            monkeypatch.setattr(module, "generation_seconds", _scaled(rlhf_cost.generation_seconds, 2))
    elif calculator == "rlhf_flop_share":
        monkeypatch.setattr(training, "TRAINING_FLOPS_PER_PARAM_PER_TOKEN", 8)
    elif calculator == "roofline_kernels":
        monkeypatch.setattr(hardware, "attainable_flops", _scaled(hardware.attainable_flops, 0.5))
    else:
        raise AssertionError(f"no planted slip for {calculator}")


@pytest.mark.parametrize("calculator", CALCULATORS)
def test_predictions_are_computed_by_the_calculator(records, monkeypatch, calculator):
    """A slip in the calculator moves every one of its rows, and its pins catch it: nothing predicted is typed."""
    before = {r.run: r.predicted for r in records if r.calculator == calculator}
    _patch(monkeypatch, calculator)
    after = rows(calculator)
    assert {r.run for r in after} == set(before)
    for r in after:
        assert not math.isclose(r.predicted, before[r.run], rel_tol=1e-9), f"{calculator}: {r.run} did not move"
    assert not _matches(PINNED[calculator], summary(after)[calculator])


def _entry(**overrides) -> Entry:
    fields = dict(calculator="planner", run="a run", source="Somebody et al., a paper, Table 9", inputs={"n_gpus": 8},
                  quantity="training throughput", unit="tokens/s per GPU", published=100.0, predict=lambda: 110.0,
                  split="holdout", omits="nothing, for this test")
    return Entry(**{**fields, **overrides})


def test_an_entry_evaluates_to_a_record():
    r = _entry().evaluate()
    assert (r.predicted, r.relative_error, r.abs_error) == (110.0, pytest.approx(0.1), pytest.approx(0.1))
    assert dataclasses.is_dataclass(r) and r.inputs["n_gpus"] == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.predicted = 1.0


@pytest.mark.parametrize("overrides, message", [
    (dict(split="train"), "split must be one of"),
    (dict(source=" "), "source must be a non-empty string"),
    (dict(run=""), "run must be a non-empty string"),
    (dict(omits=None), "omits must be a non-empty string"),
    (dict(published=0.0), "published .* must be a finite number > 0"),
    (dict(published=float("nan")), "published .* must be a finite number > 0"),
    (dict(published=True), "published .* must be a finite number > 0"),
    (dict(predict=42.0), "predict must be a function"),
    (dict(inputs={}), "inputs must be a non-empty mapping"),
    (dict(inputs={"": 1}), "every input needs a non-empty string name"),
])
def test_bad_entries_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        _entry(**overrides)


@pytest.mark.parametrize("value", [0.0, -1.0, float("inf"), float("nan"), "110", None])
def test_a_prediction_that_is_not_a_positive_number_is_refused(value):
    with pytest.raises(ValueError, match="the planner row 'a run': predicted must be a finite number > 0"):
        _entry(predict=lambda: value).evaluate()


def test_unknown_calculators_and_bad_records_are_refused():
    with pytest.raises(ValueError, match="unknown calculator 'roofline'; the scorecard has rows for: planner"):
        rows("roofline")
    with pytest.raises(ValueError, match="unknown calculator"):
        scorecard.entries("")
    with pytest.raises(ValueError, match="records must be a list of Record"):
        summary([{"calculator": "planner"}])
    with pytest.raises(ValueError, match="records must be a list of Record"):
        summary(tuple(rows("planner_5d")))


def test_summary_of_a_subset(records):
    subset = [r for r in records if r.calculator == "planner" and r.split == "fit"]
    s = summary(subset)
    assert list(s) == ["planner"] and s["planner"].n_holdout == 0 and s["planner"].median_abs_error is None
    assert s["planner"].n_fit == 10
