import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from utils.serving.costs.batching_plots import draw_schedule, plot_schedule  # noqa: E402
from utils.serving.runtime.engine import StepRecord  # noqa: E402

SCHEDULE = [StepRecord(((0, 5, "prefill"),), ()), StepRecord(((0, 1, "decode"), (1, 3, "prefill")), ()),
            StepRecord(((0, 1, "decode"),), (1,))]


def test_one_cell_per_chunk_and_a_mark_per_preemption():
    fig = plot_schedule(SCHEDULE, budget=8)
    ax = fig.axes[0]
    assert len(ax.patches) == 4
    assert sum(1 for line in ax.lines if line.get_marker() == "x") == 1
    assert [t.get_text() for t in ax.get_yticklabels()] == ["req 0", "req 1"]
    plt.close(fig)


def test_partial_drawing_titles_the_last_step():
    fig, ax = plt.subplots()
    draw_schedule(ax, SCHEDULE, upto=2, budget=8)
    assert len(ax.patches) == 3 and "step 1: 2 requests, 4 tokens of a budget of 8" in ax.get_title()
    plt.close(fig)
