import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from utils.parallel.planning.planner import plan  # noqa: E402
from utils.parallel.planning.planner_plots import (  # noqa: E402
    mesh_rank,
    plot_device_mesh,
    plot_plan,
    plot_planner,
    plot_published_comparison,
)
from utils.parallel.planning.published_runs import MEGATRON_RUNS, compare  # noqa: E402


def test_mesh_rank_matches_torch_device_mesh_order():
    # init_device_mesh(("dp", "pp", "tp")) numbers ranks row-major, the last dimension fastest.
    ranks = [mesh_rank(d, p, t, pp=2, tp=4) for d in range(2) for p in range(2) for t in range(4)]
    assert ranks == list(range(16))


def test_figures_are_figures():
    run = MEGATRON_RUNS[0]
    for fig in (plot_device_mesh(), plot_plan(plan(run.model, run.cluster, run.layout)), plot_planner(),
                plot_published_comparison(compare())):
        assert isinstance(fig, Figure)
        plt.close(fig)


def test_an_impossible_layout_draws_its_error_instead_of_raising():
    fig = plot_planner(tp=7)
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("not a valid layout" in t for t in texts)
    plt.close(fig)


def test_bad_mesh_raises():
    with pytest.raises(ValueError):
        plot_device_mesh(dp=0)
    with pytest.raises(ValueError):
        plot_device_mesh(dp=64, pp=4, tp=8)


def test_the_comparison_shows_what_the_planner_cannot_see():
    from utils.parallel.planning.planner import BLIND_SPOTS

    fig = plot_published_comparison(compare())
    texts = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert all(what in texts for what, _ in BLIND_SPOTS)
    plt.close(fig)
