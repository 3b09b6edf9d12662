"""The chapter's figures draw for their defaults and for other inputs, and refuse impossible timelines."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from utils.serving.costs.step_time_plots import plot_pareto, plot_phase_roofline, plot_request_timeline  # noqa: E402


@pytest.mark.parametrize("draw", [
    lambda: plot_pareto(),
    lambda: plot_pareto(context=16384, tpot_slo_ms=5.0, gpu="H200"),
    lambda: plot_phase_roofline(),
    lambda: plot_phase_roofline(batch=1, context=128, prompt_len=16, gpu="A100-SXM4-80GB"),
    lambda: plot_request_timeline(0.0, 0.1, [0.12, 0.15, 0.3], tpot_slo=0.05),
])
def test_figures_draw(draw):
    fig = draw()
    assert isinstance(fig, Figure)
    plt.close(fig)


def test_pareto_legend_names_the_operating_point():
    fig = plot_pareto(context=1024, tpot_slo_ms=20.0)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    plt.close(fig)
    assert any("B=362" in label for label in labels), labels  # Llama-3-8B's largest batch within 20 ms


def test_timeline_refuses_tokens_before_the_first():
    with pytest.raises(ValueError):
        plot_request_timeline(0.0, 0.5, [0.4])
    with pytest.raises(ValueError):
        plot_request_timeline(1.0, 0.5, [])
