"""The scorecard drawn and tabulated: the page "How good are the book's models?" (chapters/99-scorecard).

Pure functions of a list of :class:`~utils.scorecard.record.Record` (default:
:func:`utils.scorecard.rows` (), computed when called):

- :func:`plot_scatter`: predicted against published, log-log, one colour per calculator;
- :func:`plot_calculator`: one calculator's rows, each row's error (or, for a bound, the
  fraction of the bound the run reached) with its name: the row's details with no kernel;
- :func:`summary_table` and :func:`bounds_table`: the per-calculator tables, as text;
- :func:`worst_rows`: the holdout rows furthest from what was published;
- :func:`fraction_of_bound` and :func:`verdict`: what a row or a calculator's errors mean for a reader.

The relative error is ``predicted / published - 1`` (:class:`~utils.scorecard.record.Record`).
The three calculators of :data:`~utils.scorecard.BOUNDS` print rates that a real run should
stay below, so their rows are read as ``published / predicted``: the fraction of the bound reached.
"""

from __future__ import annotations

import statistics

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from utils import scorecard
from utils.scorecard.record import Record

GOOD_TO = 0.15
"""A calculator whose median holdout |error| is at most this is called good to about ±10-15 % (:func:`verdict`)."""

_TAB20 = {"planner": 0, "planner_5d": 1, "planner_memory": 2, "activation_memory": 4, "recompute_flops": 5,
          "collectives": 6, "network_topology": 7, "deployment": 8, "step_time": 9, "serving_calibrated": 16,
          "rlhf_cost": 10, "rlhf_flop_share": 12, "roofline_kernels": 14}
_COLOURS = {name: plt.get_cmap("tab20")(_TAB20[name]) for name in scorecard.CALCULATORS}  # KeyError: give it a colour


def _records(records: list[Record] | None) -> list[Record]:
    if records is None:
        return scorecard.rows()
    if not isinstance(records, list) or not all(isinstance(r, Record) for r in records):
        raise ValueError("records must be a list of Record (what utils.scorecard.rows() returns)")
    return records


def _check_calculator(calculator: str) -> str:
    if calculator not in scorecard.CALCULATORS:
        raise ValueError(f"unknown calculator {calculator!r}; the scorecard has: {', '.join(scorecard.CALCULATORS)}")
    return calculator


def fraction_of_bound(record: Record) -> float:
    """``published / predicted``: how much of a bound calculator's roof the published run reached (1 = on the roof).

    Only for the rows of :data:`~utils.scorecard.BOUNDS`, whose predictions are rates (tokens/s, TFLOP/s, GB/s).
    """
    if record.calculator not in scorecard.BOUNDS:
        raise ValueError(f"{record.calculator!r} is an estimate, not a bound; bounds are {scorecard.BOUNDS}")
    return record.published / record.predicted


def worst_rows(records: list[Record] | None = None, n: int = 5, bounds: bool = False) -> list[Record]:
    """The ``n`` holdout rows with the largest ``|predicted / published - 1|``, worst first (bounds left out unless asked)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    pool = [r for r in _records(records) if r.split == "holdout" and (bounds or r.calculator not in scorecard.BOUNDS)]
    return sorted(pool, key=lambda r: r.abs_error, reverse=True)[:n]


def _pct(x: float | None, signed: bool = False) -> str:
    return "-" if x is None else f"{x:+.0%}" if signed else f"{x:.0%}"


def summary_table(records: list[Record] | None = None) -> str:
    """One line per estimating calculator: holdout n, median and worst |error|, signed median; fit rows apart."""
    table = scorecard.summary(_records(records))
    head = f"{'calculator':18s} {'holdout':>7s} {'median':>7s} {'worst':>7s} {'signed':>7s}   {'fit':>3s} {'median':>7s} {'worst':>7s}"
    lines = [head, "-" * len(head)]
    for name, s in table.items():
        if name in scorecard.BOUNDS:
            continue
        lines.append(f"{name:18s} {s.n_holdout:7d} {_pct(s.median_abs_error):>7s} {_pct(s.worst_abs_error):>7s} "
                     f"{_pct(s.signed_median, True):>7s}   {s.n_fit:3d} {_pct(s.fit_median_abs_error):>7s} "
                     f"{_pct(s.fit_worst_abs_error):>7s}")
    return "\n".join(lines)


def bounds_table(records: list[Record] | None = None) -> str:
    """One line per bound calculator: rows, and the median and range of the fraction of the bound real runs reached."""
    recs = _records(records)
    head = f"{'bound':18s} {'rows':>4s} {'median reach':>12s} {'lowest':>7s} {'highest':>7s}"
    lines = [head, "-" * len(head)]
    for name in scorecard.BOUNDS:
        reach = [fraction_of_bound(r) for r in recs if r.calculator == name and r.split == "holdout"]
        if reach:
            lines.append(f"{name:18s} {len(reach):4d} {statistics.median(reach):12.2f} {min(reach):7.2f} "
                         f"{max(reach):7.2f}")
    return "\n".join(lines)


def verdict(calculator: str, records: list[Record] | None = None) -> str:
    """A sentence on how to use a calculator, from its holdout rows: good to ±15 %, a bound, or not yet a prediction."""
    _check_calculator(calculator)
    hold = [r for r in _records(records) if r.calculator == calculator and r.split == "holdout"]
    if not hold:
        return f"{calculator}: no holdout rows, no verdict"
    if calculator in scorecard.BOUNDS:
        reach = [fraction_of_bound(r) for r in hold]
        return (f"{calculator}: a bound and nothing more; real runs reach {statistics.median(reach):.2f} of it "
                f"(median of {len(hold)}, from {min(reach):.2f} to {max(reach):.2f})")
    errors = [r.relative_error for r in hold]
    median = statistics.median(abs(e) for e in errors)
    worst = max(abs(e) for e in errors)
    side = "high" if statistics.median(errors) > 0 else "low"
    n = f"{len(hold)} row{'s' if len(hold) > 1 else ''}"
    if worst < 0.005:
        return f"{calculator}: exact on its {n} (worst {worst:.1%})"
    if median <= GOOD_TO:
        return f"{calculator}: good to ±{median:.{1 if median < 0.1 else 0}%} (median of {n}), worst {worst:.0%}"
    return f"{calculator}: not yet a prediction, median {median:.0%} {side}, worst {worst:.0%} ({n})"


def plot_scatter(records: list[Record] | None = None, band: float = GOOD_TO) -> Figure:
    """Every row's prediction against its published value, log-log, one colour per calculator.

    Filled: holdout; hollow: fit; triangles: bounds. The grey band is ±``band`` around equality. The units differ
    between calculators (each row keeps its own), so only the distance from the diagonal is comparable.
    """
    recs = _records(records)
    if not recs:
        raise ValueError("records is empty: nothing to plot")
    if not 0 < band < 1:
        raise ValueError(f"band must be a fraction in (0, 1), got {band!r}")
    fig, ax = plt.subplots(figsize=(7.6, 5.0))
    lo = min(min(r.published, r.predicted) for r in recs) / 2
    hi = max(max(r.published, r.predicted) for r in recs) * 2
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    ax.fill_between([lo, hi], [lo * (1 - band), hi * (1 - band)], [lo * (1 + band), hi * (1 + band)],
                    color="0.85", zorder=0, label=f"within ±{band:.0%}")
    for name in scorecard.CALCULATORS:
        group = [r for r in recs if r.calculator == name]
        if not group:
            continue
        marker = "^" if name in scorecard.BOUNDS else "o"
        for split, filled in (("holdout", True), ("fit", False)):
            pts = [r for r in group if r.split == split]
            if pts:
                colour = _COLOURS[name]
                ax.scatter([r.published for r in pts], [r.predicted for r in pts], s=26, marker=marker,
                           facecolors=colour if filled else "none", edgecolors=colour, linewidths=1.0,
                           label=name + (" (bound)" if name in scorecard.BOUNDS else "") + ("" if filled else ", fit"))
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="published (the row's own unit)",
           ylabel="predicted by the book's calculator", title="Every scorecard row: above the diagonal, too high")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    return fig


def _short(text: str, width: int = 84) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def plot_calculator(calculator: str = "planner", records: list[Record] | None = None) -> Figure:
    """One calculator's rows as bars, labelled by run: the error ``predicted / published - 1`` (fit rows hatched),
    or for a bound calculator the fraction of the bound each run reached."""
    _check_calculator(calculator)
    recs = [r for r in (scorecard.rows(calculator) if records is None else _records(records))
            if r.calculator == calculator]
    if not recs:
        raise ValueError(f"no rows for {calculator!r} in records")
    bound = calculator in scorecard.BOUNDS
    values = [fraction_of_bound(r) if bound else r.relative_error for r in recs]
    order = sorted(range(len(recs)), key=lambda i: values[i])
    fig, ax = plt.subplots(figsize=(9.0, 1.2 + 0.22 * len(recs)))
    ys = range(len(order))
    colour = _COLOURS[calculator]
    bars = ax.barh(ys, [values[i] for i in order], color=colour, edgecolor="0.3", linewidth=0.5)
    for bar, i in zip(bars, order):
        if recs[i].split == "fit":
            bar.set_hatch("///")
            bar.set_facecolor("white")
    ax.set_yticks(list(ys), [_short(recs[i].run) + (" [fit]" if recs[i].split == "fit" else "") for i in order],
                  fontsize=6.5)
    if bound:
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set(xlabel="fraction of the bound the published run reached (1 = on the roof)", xlim=(0, max(1.05, *values)))
    else:
        ax.axvline(0.0, color="black", lw=0.8)
        ax.axvspan(-GOOD_TO, GOOD_TO, color="0.9", zorder=0)
        ax.xaxis.set_major_formatter(lambda x, _: f"{x:+.0%}")
        ax.set(xlabel="predicted / published - 1")
    unit = recs[0].unit if len({r.unit for r in recs}) == 1 else "several units"
    ax.set_title(f"{calculator}: {len(recs)} rows ({unit})", fontsize=9)
    fig.tight_layout()
    return fig
