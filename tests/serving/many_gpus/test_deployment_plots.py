"""The chapter's figures draw for their defaults and for other inputs."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from utils.serving.many_gpus import deployment as d  # noqa: E402
from utils.serving.many_gpus import published_deployments as pd  # noqa: E402
from utils.serving.many_gpus.deployment_plots import plot_published, plot_step_breakdown, plot_tp_pareto  # noqa: E402


@pytest.mark.parametrize("draw", [
    lambda: plot_tp_pareto(),
    lambda: plot_tp_pareto(model="Llama-3-8B", context=8192, tpot_slo_ms=20.0, gpu="H200"),
    lambda: plot_published(pd.hold_against()),
    lambda: plot_step_breakdown({f"EP{ep}": d.step(d.moe_shape(), d.Layout(ep=ep, weight_bytes=1.0), 64, 2048)
                                 for ep in (32, 144)}),
])
def test_figures_draw(draw):
    fig = draw()
    assert isinstance(fig, Figure)
    plt.close(fig)


def test_tp_pareto_draws_only_layouts_that_fit():
    fig = plot_tp_pareto(model="Llama-3-70B")  # 141 GB of bf16 weights: TP=1 cannot hold them
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    plt.close(fig)
    assert not any(label.startswith("TP=1:") for label in labels) and any(l.startswith("TP=8:") for l in labels)
