"""How good are the book's models? Every calculator held against published measurements, out of sample.

One :class:`~utils.scorecard.record.Record` per comparison (issue 33): which
calculator, which run, where it was published, the inputs read from the same
source, the quantity and unit, the published value, the value the book's own
function predicts (computed when :func:`rows` runs, never typed), the
relative error ``predicted / published - 1``, the split (``"fit"`` if a
constant of the calculator was fitted on the row, else ``"holdout"``) and
what the model leaves out. :func:`summary` condenses them per calculator,
holdout rows apart from fit rows.

The rows live in one module per part of the book:

- :mod:`utils.scorecard.training`: ``planner``, ``planner_5d``, ``planner_memory`` (part 2, chapter 13);
- :mod:`utils.scorecard.memory`: ``activation_memory``, ``recompute_flops`` (part 2, chapter 8);
- :mod:`utils.scorecard.network`: ``collectives``, ``network_topology`` (part 2, chapters 2 and 5);
- :mod:`utils.scorecard.serving`: ``deployment``, ``step_time``, ``serving_calibrated`` (part 5, chapters 1 and 6);
- :mod:`utils.scorecard.rl`: ``rlhf_cost``, ``rlhf_flop_share`` (part 4, chapter 8);
- :mod:`utils.scorecard.kernels`: ``roofline_kernels`` (part 1, chapter 4, against ``benchmarks/results/``).

A row is added by appending an :class:`~utils.scorecard.record.Entry` to its
module's ``entries()``: a source a reader can open (document and table, or
repository, path and commit), the inputs taken from it (assumptions named as
such), and a ``predict`` that calls the calculator, looking its functions and
constants up on their modules when it runs, so that a change of the
calculator moves the row. ``tests/test_scorecard.py`` recomputes every row,
plants a slip in each calculator to show its rows move, and pins each
calculator's median and worst holdout error. Three calculators print bounds,
not estimates (:data:`BOUNDS`): their error is how far real runs stay below
the roof.
"""

from __future__ import annotations

import statistics
from typing import NamedTuple

from utils.scorecard import kernels, memory, network, rl, serving, training
from utils.scorecard.record import SPLITS, Entry, Record

__all__ = ["BOUNDS", "CALCULATORS", "SPLITS", "CalculatorSummary", "Entry", "Record", "entries", "rows", "summary"]

_MODULES = (training, memory, network, serving, rl, kernels)

CALCULATORS = ("planner", "planner_5d", "planner_memory", "activation_memory", "recompute_flops", "collectives",
               "network_topology", "deployment", "step_time", "serving_calibrated", "rlhf_cost", "rlhf_flop_share",
               "roofline_kernels")
"""Every calculator with rows: training (part 2), networks (part 2), serving (part 5), RL (part 4), kernels (part 1)."""

BOUNDS = ("deployment", "step_time", "roofline_kernels")
"""Calculators whose prediction is a roofline bound, not an estimate: a real run should land below it (for a
rate, ``relative_error > 0``; for a time, ``< 0``), and the size of the error is how far it stays from the roof."""


def _check_calculator(calculator: str | None) -> str | None:
    if calculator is not None and calculator not in CALCULATORS:
        raise ValueError(f"unknown calculator {calculator!r}; the scorecard has rows for: {', '.join(CALCULATORS)}")
    return calculator


def entries(calculator: str | None = None) -> list[Entry]:
    """The rows before their predictions are computed (of one ``calculator``, or all)."""
    _check_calculator(calculator)
    out = [e for module in _MODULES for e in module.entries()]
    unknown = sorted({e.calculator for e in out} - set(CALCULATORS))
    if unknown:
        raise ValueError(f"rows name calculators missing from CALCULATORS: {', '.join(unknown)}")
    return [e for e in out if calculator is None or e.calculator == calculator]


def rows(calculator: str | None = None) -> list[Record]:
    """Every comparison (of one ``calculator``, or all), each prediction computed now by the book's function."""
    return [e.evaluate() for e in entries(calculator)]


class CalculatorSummary(NamedTuple):
    """One calculator's scorecard: holdout rows, and the fit rows apart.

    ``median_abs_error`` and ``worst_abs_error`` are over the holdout rows
    (``worst_run`` names the worst); ``signed_median`` is the median of
    ``predicted / published - 1`` there (positive: the calculator predicts
    more than was published). The ``fit_`` fields are the same over fit rows
    (``None`` without fit rows). A calculator without holdout rows has
    ``None`` in the holdout fields.
    """

    calculator: str
    n_holdout: int
    median_abs_error: float | None
    worst_abs_error: float | None
    worst_run: str | None
    signed_median: float | None
    n_fit: int
    fit_median_abs_error: float | None
    fit_worst_abs_error: float | None


def _summarise(calculator: str, records: list[Record]) -> CalculatorSummary:
    hold = [r for r in records if r.split == "holdout"]
    fit = [r for r in records if r.split == "fit"]
    worst = max(hold, key=lambda r: r.abs_error) if hold else None
    return CalculatorSummary(
        calculator, len(hold),
        statistics.median(r.abs_error for r in hold) if hold else None,
        worst.abs_error if worst else None, worst.run if worst else None,
        statistics.median(r.relative_error for r in hold) if hold else None,
        len(fit), statistics.median(r.abs_error for r in fit) if fit else None,
        max(r.abs_error for r in fit) if fit else None)


def summary(records: list[Record] | None = None) -> dict[str, CalculatorSummary]:
    """Per calculator (in :data:`CALCULATORS` order): holdout count, median and worst |error|, signed median, fit apart.

    ``records`` defaults to :func:`rows` (); pass a subset to summarise it alone.
    """
    if records is None:
        records = rows()
    if not isinstance(records, list) or not all(isinstance(r, Record) for r in records):
        raise ValueError("records must be a list of Record (what rows() returns)")
    by_name = {name: [r for r in records if r.calculator == name] for name in CALCULATORS}
    return {name: _summarise(name, group) for name, group in by_name.items() if group}
