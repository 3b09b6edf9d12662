import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from utils.rl import bellman_plots as bp  # noqa: E402


def test_every_plot_function_returns_a_figure():
    figures = [bp.plot_student_mrp(0.5), bp.plot_estimate_convergence(np.eye(2)[[1, 0]] * 0.5 + 0.25, 500),
               bp.plot_monte_carlo(np.arange(10.0), 4.5), bp.plot_bellman_iteration(0.9, 10),
               bp.plot_values_vs_gamma(0.3), bp.plot_backup_diagrams(), bp.plot_student_policy(),
               bp.plot_student_policy(p_quit=0.0),
               bp.plot_policy_enumeration(np.zeros((3, 4)), 1, ["a", "b", "c"], list("wxyz"), 0.9)]
    assert all(isinstance(f, Figure) for f in figures)
    fig, ax = plt.subplots()
    bp.draw_evaluation_step(ax, 3)
    assert "sweep k = 3" in ax.get_title()
    plt.close("all")
