"""utils.scorecard.plots: the scorecard page's tables and figures, on hand-made rows (independent of the registry)."""

from types import MappingProxyType

import matplotlib
import pytest

matplotlib.use("Agg")

from utils.scorecard import plots  # noqa: E402
from utils.scorecard.record import Record  # noqa: E402


def _row(calculator: str, published: float, predicted: float, split: str = "holdout", run: str = "r") -> Record:
    return Record(calculator, run, "a paper, table 1", MappingProxyType({"n_gpus": 8}), "q", "GB/s", published,
                  predicted, predicted / published - 1, split, "overlap")


ROWS = [_row("planner", 100, 110, run="a"), _row("planner", 100, 70, run="b"), _row("planner", 100, 101, "fit"),
        _row("collectives", 100, 300, run="c"), _row("step_time", 50, 100, run="d"), _row("step_time", 20, 100, run="e")]


def test_fraction_of_bound_is_published_over_predicted_and_only_for_bounds():
    assert plots.fraction_of_bound(ROWS[4]) == 0.5
    with pytest.raises(ValueError, match="estimate, not a bound"):
        plots.fraction_of_bound(ROWS[0])


def test_worst_rows_are_holdout_estimates_worst_first():
    assert [r.run for r in plots.worst_rows(ROWS, n=2)] == ["c", "b"]
    assert [r.run for r in plots.worst_rows(ROWS, n=9, bounds=True)][:2] == ["e", "c"]
    with pytest.raises(ValueError, match="positive int"):
        plots.worst_rows(ROWS, n=0)


def test_tables_hold_every_calculator_in_its_own_table():
    estimates, bounds = plots.summary_table(ROWS), plots.bounds_table(ROWS)
    planner = next(line for line in estimates.splitlines() if line.startswith("planner"))
    assert planner.split() == ["planner", "2", "20%", "30%", "-10%", "1", "1%", "1%"]
    assert "step_time" not in estimates and "collectives" in estimates
    assert next(line for line in bounds.splitlines() if line.startswith("step_time")).split() == \
        ["step_time", "2", "0.35", "0.20", "0.50"]


def test_verdict_says_good_bound_or_not_yet():
    assert plots.verdict("planner", ROWS).startswith("planner: not yet a prediction, median 20% low")
    assert plots.verdict("planner", ROWS[:1]).startswith("planner: good to ±10%")
    assert "a bound and nothing more" in plots.verdict("step_time", ROWS)
    assert "no holdout rows" in plots.verdict("rlhf_cost", ROWS)
    with pytest.raises(ValueError, match="unknown calculator"):
        plots.verdict("nope", ROWS)


def test_scatter_draws_one_series_per_calculator_and_split():
    fig = plots.plot_scatter(ROWS)
    labels = [c.get_label() for c in fig.axes[0].collections]
    assert labels[1:] == ["planner", "planner, fit", "collectives", "step_time (bound)"]
    with pytest.raises(ValueError, match="empty"):
        plots.plot_scatter([])
    with pytest.raises(ValueError, match="list of Record"):
        plots.plot_scatter(["row"])


def test_calculator_bars_show_each_row_sorted():
    fig = plots.plot_calculator("planner", ROWS)
    widths = [p.get_width() for p in fig.axes[0].containers[0]]
    assert widths == pytest.approx([-0.3, 0.01, 0.1])
    assert [p.get_width() for p in plots.plot_calculator("step_time", ROWS).axes[0].containers[0]] == [0.2, 0.5]
    with pytest.raises(ValueError, match="no rows"):
        plots.plot_calculator("rlhf_cost", ROWS)


def test_every_calculator_has_a_colour_of_its_own():
    from utils import scorecard
    assert set(plots._COLOURS) == set(scorecard.CALCULATORS)
    assert len(set(plots._COLOURS.values())) == len(scorecard.CALCULATORS)
    last = scorecard.CALCULATORS[-1]
    assert plots.plot_calculator(last, [_row(last, 100, 110)]).axes[0].containers[0]
