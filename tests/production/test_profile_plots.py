"""Where a profiled step's time goes: operator classes, the per-step breakdown, the figure."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from utils.production import profile_plots as pp  # noqa: E402
from utils.production import trace_timeline as tt  # noqa: E402


@pytest.mark.parametrize("name, kind", [
    ("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::mul", "element-wise"), ("aten::_softmax", "element-wise"),
    ("aten::copy_", "copies and views"), ("aten::view", "copies and views"), ("gloo:all_reduce", "collectives"),
    ("c10d::allreduce_", "collectives"), ("aten::arange", "other operators"), ("forward", ""),
    ("autograd::engine::evaluate_function: MmBackward0", ""),
])
def test_classify(name, kind):
    assert pp.classify(name) == kind


def test_breakdown_by_hand():
    """forward 100 us holds mm 30 us and mul 20 us; optimizer 50 us holds copy_ 10 us; steps = 2."""
    trace = {"traceEvents": [{"ph": "X", "pid": 1, "tid": 1, **e} for e in (
        {"name": "forward", "ts": 0, "dur": 100}, {"name": "aten::mm", "ts": 10, "dur": 30},
        {"name": "aten::mul", "ts": 50, "dur": 20}, {"name": "optimizer", "ts": 100, "dur": 50},
        {"name": "aten::copy_", "ts": 110, "dur": 10}, {"name": "ProfilerStep#1", "ts": 0, "dur": 160})]}
    parts = pp.breakdown(tt.read_chrome_trace(trace), steps=2)
    assert parts == pytest.approx({"matmul": 0.015, "element-wise": 0.010, "copies and views": 0.005,
                                   "collectives": 0.0, "other operators": 0.0, "between operators": 0.045})
    assert pp.operators_per_step(tt.read_chrome_trace(trace), steps=2) == 1.5
    with pytest.raises(ValueError, match="steps must be a positive int"):
        pp.breakdown([], steps=0)


def test_plot_step_breakdown_draws_one_bar_per_class():
    fig = pp.plot_step_breakdown(batch=2)
    bars = fig.axes[0].patches
    assert 3 <= len(bars) <= len(pp.CLASSES)
    assert "batch 2:" in fig.axes[0].get_title()
