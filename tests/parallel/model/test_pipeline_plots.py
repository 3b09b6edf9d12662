"""utils.parallel.model.pipeline_plots: the zero-bubble chart reports the simulation and Table 2; DualPipe's sketch checks its input."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from utils.parallel.model import zero_bubble as zb  # noqa: E402
from utils.parallel.model.pipeline_plots import plot_dualpipe_placement, plot_zero_bubble  # noqa: E402


def test_zero_bubble_chart_draws_every_operation_and_titles_the_bubble():
    fig = plot_zero_bubble("zb-h1", 4, 8)
    ax = fig.axes[0]
    assert len(ax.patches) == 3 * 4 * 8  # one bar per F, B and W
    assert "stage 0 idles 3 (Table 2: 3)" in ax.get_title()
    assert "assumes" not in ax.get_title()
    plt.close(fig)


def test_zero_bubble_chart_flags_settings_outside_table_2():
    fig = plot_zero_bubble("zb-h2", 8, 8)
    title = fig.axes[0].get_title()
    assert f"idles {zb.stage_bubble(zb.schedule('zb-h2', 8, 8))[0]:.3g}" in title and "assumes" in title
    plt.close(fig)


def test_dualpipe_placement_pairs_stage_d_with_p_minus_1_minus_d():
    fig = plot_dualpipe_placement(4)
    texts = [t.get_text() for t in fig.axes[1].texts if t.get_text()]  # the arrows are empty annotations
    assert texts == ["stage 0", "stage 3", "stage 1", "stage 2", "stage 2", "stage 1", "stage 3", "stage 0"]
    plt.close(fig)
    with pytest.raises(ValueError, match="even number"):
        plot_dualpipe_placement(5)
