"""The figures of part 4's chapters on Markov reward processes and MDPs (pure functions returning a Figure).

Used by ``chapters/04-rl/02-markov-chains-and-reward-processes`` and
``chapters/04-rl/03-mdps-and-bellman-equations``; every function draws from its
arguments only, so ``utils.viz.live`` can put sliders on it.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

from utils.rl.markov import episodic_value, estimate_transition_matrix, evaluation_history, sample_path
from utils.rl.mdp import induced_mrp, mrp_value
from utils.rl.student import STUDENT_MDP_ACTIONS, STUDENT_MDP_STATES, STUDENT_MRP_STATES, student_mdp, student_mrp

STUDENT_MRP_LAYOUT = {"Class 1": (0.0, 1.4), "Class 2": (2.2, 1.4), "Class 3": (4.4, 1.4), "Pass": (6.6, 1.4),
                      "Pub": (3.3, -0.4), "Facebook": (0.0, 3.4), "Sleep": (5.5, 3.4)}


def _arrow(ax, a, b, label="", color="0.35", rad=0.0, self_loop=False):
    if self_loop:
        ax.annotate("", xy=(a[0] + 0.18, a[1] + 0.2), xytext=(a[0] - 0.18, a[1] + 0.2),
                    arrowprops=dict(arrowstyle="->", color=color, connectionstyle="arc3,rad=-1.6"))
        ax.text(a[0], a[1] + 0.62, label, ha="center", fontsize=8, color=color)
        return
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=10, color=color, shrinkA=20, shrinkB=20,
                                 connectionstyle=f"arc3,rad={rad}"))
    if label:
        mid = (np.array(a) + np.array(b)) / 2 + rad * 0.5 * np.array([b[1] - a[1], a[0] - b[0]])
        ax.text(*mid, label, fontsize=8, color=color, ha="center", va="center",
                bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none"))


def draw_student_mrp(ax, values: np.ndarray, title: str, vmax: float | None = None) -> None:
    """Draw Silver's Student MRP on ``ax``: transition probabilities on the arrows, R and ``values`` at each state."""
    P, R = student_mrp()
    vmax = float(np.abs(values).max()) if vmax is None else vmax
    names = STUDENT_MRP_STATES
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if P[i, j] > 0:
                pa, pb = STUDENT_MRP_LAYOUT[a], STUDENT_MRP_LAYOUT[b]
                rad = 0.3 if (P[j, i] > 0 and i != j) else 0.0
                _arrow(ax, pa, pb, f"{P[i, j]:.1f}", rad=rad, self_loop=i == j)
    for i, name in enumerate(names):
        x, y = STUDENT_MRP_LAYOUT[name]
        color = plt.cm.RdYlGn(0.5 + 0.5 * np.clip(values[i] / max(vmax, 1e-12), -1, 1))
        ax.add_patch(plt.Circle((x, y), 0.3, color=color, ec="k", zorder=3))
        ax.text(x, y + 0.05, f"{values[i]:.1f}", ha="center", va="center", fontsize=9, weight="bold", zorder=4)
        ax.text(x + 0.38, y - 0.3, f"{name}\nR={R[i]:g}", ha="left", va="top", fontsize=8)
    ax.set_xlim(-0.8, 7.6)
    ax.set_ylim(-1.2, 4.4)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title)


def plot_student_mrp(gamma: float = 0.9) -> Figure:
    """Silver's Student MRP as a graph, each state coloured and labelled with its value at ``gamma``."""
    P, R = student_mrp()
    fig, ax = plt.subplots(figsize=(7.6, 4.6))
    draw_student_mrp(ax, episodic_value(P, R, [6], gamma), f"Student MRP: V(s) in each circle, gamma = {gamma:g}")
    return fig


def draw_evaluation_step(ax, step: int, gamma: float = 0.9) -> None:
    """Frame ``step`` of iterative evaluation on the Student MRP: ``V_step`` on the graph (for ``viz.animate``)."""
    P, R = student_mrp()
    history = evaluation_history(P, R, gamma, step)
    error = np.abs(history[-1] - mrp_value(P, R, gamma)).max()
    draw_student_mrp(ax, history[-1], f"sweep k = {step}: V_k(s), max error {error:.2f}",
                     vmax=float(np.abs(mrp_value(P, R, gamma)).max()))


def plot_estimate_convergence(P: Sequence[Sequence[float]], max_steps: int = 100_000, seed: int = 0) -> Figure:
    """Max-norm error of the counted ``P_hat`` against the true ``P`` as the observed path grows (log-log)."""
    P = np.asarray(P, dtype=float)
    path = sample_path(P, 0, max_steps, seed=seed)
    lengths = np.unique(np.logspace(1, np.log10(max_steps), 40).astype(int))
    errors = [np.abs(estimate_transition_matrix(path[:n + 1], len(P)) - P).max() for n in lengths]
    fig, ax = plt.subplots(figsize=(6.0, 3.4))
    ax.loglog(lengths, errors, "o-", ms=3, label=r"$\max_{s,s'} |\hat P - P|$")
    ax.loglog(lengths, 1.0 / np.sqrt(lengths), "k--", lw=1, label=r"$1/\sqrt{n}$")
    ax.set_xlabel("transitions observed, n")
    ax.set_ylabel("error of the estimate")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_monte_carlo(returns: np.ndarray, exact: float, label: str = "Class 1") -> Figure:
    """The running mean of sampled returns against the exact value, with a +/- 2 standard-error band."""
    returns = np.asarray(returns, dtype=float)
    n = np.arange(1, len(returns) + 1)
    mean = np.cumsum(returns) / n
    stderr = returns.std() / np.sqrt(n)
    fig, ax = plt.subplots(figsize=(6.0, 3.4))
    ax.semilogx(n, mean, label="running mean of sampled returns")
    ax.fill_between(n, exact - 2 * stderr, exact + 2 * stderr, color="tab:green", alpha=0.2,
                    label=r"exact $\pm$ 2 standard errors")
    ax.axhline(exact, color="tab:green", lw=1, label=f"exact V({label}) = {exact:.2f}")
    ax.set_xlabel("episodes sampled")
    ax.set_ylabel("estimate of V")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_bellman_iteration(gamma: float = 0.9, n_sweeps: int = 60) -> Figure:
    """Iterative evaluation of the Student MRP: each state's ``V_k`` (left), the error against ``gamma^k`` (right)."""
    P, R = student_mrp()
    V = mrp_value(P, R, gamma)
    history = evaluation_history(P, R, gamma, n_sweeps)
    errors = np.abs(history - V).max(-1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(8.6, 3.4))
    for i, name in enumerate(STUDENT_MRP_STATES):
        left.plot(history[:, i], label=name)
        left.axhline(V[i], color=left.lines[-1].get_color(), ls=":", lw=0.8)
    left.set_xlabel("sweep k")
    left.set_ylabel(r"$V_k(s)$")
    left.legend(fontsize=7, ncol=2)
    k = np.arange(n_sweeps + 1)
    right.semilogy(k, np.maximum(errors, 1e-16), label=r"$\|V_k - V\|_\infty$")
    right.semilogy(k, gamma ** k * errors[0], "k--", lw=1, label=r"$\gamma^k \|V_0 - V\|_\infty$")
    right.set_xlabel("sweep k")
    right.legend(fontsize=8)
    right.set_title(f"gamma = {gamma:g}")
    fig.tight_layout()
    return fig


def plot_values_vs_gamma(gamma: float = 0.9) -> Figure:
    """Student MRP values as gamma goes from 0 to 1 (lines), and at the chosen gamma (bars)."""
    P, R = student_mrp()
    grid = np.linspace(0.0, 1.0, 101)
    values = np.array([episodic_value(P, R, [6], g) for g in grid])
    at = episodic_value(P, R, [6], gamma)
    fig, (left, right) = plt.subplots(1, 2, figsize=(8.6, 3.4), gridspec_kw={"width_ratios": [1.2, 1]})
    for i, name in enumerate(STUDENT_MRP_STATES):
        left.plot(grid, values[:, i], label=name)
    left.axvline(gamma, color="k", lw=0.8, ls="--")
    left.set_xlabel(r"discount $\gamma$")
    left.set_ylabel("V(s)")
    left.legend(fontsize=7, ncol=2)
    right.barh(STUDENT_MRP_STATES, at, color=["tab:red" if v < 0 else "tab:green" for v in at])
    for i, v in enumerate(at):
        right.text(v, i, f" {v:.2f} ", va="center", ha="left" if v >= 0 else "right", fontsize=8)
    right.set_xlim(min(at.min() * 1.4, -1), max(at.max() * 1.4, 1))
    right.invert_yaxis()
    right.set_title(f"V(s) at gamma = {gamma:.2f}")
    fig.tight_layout()
    return fig


def plot_backup_diagrams() -> Figure:
    """Backup diagrams (Sutton & Barto 2018, section 3.5): V_pi, q_pi, V* and q*; open circles are states, dots actions."""
    fig, axes = plt.subplots(1, 4, figsize=(9.0, 3.0))
    titles = [r"$v_\pi(s)$: average over $\pi$, then $p$", r"$q_\pi(s,a)$: average over $p$, then $\pi$",
              r"$v_*(s)$: max over $a$, then average", r"$q_*(s,a)$: average, then max"]
    for ax, title, state_root, use_max in zip(axes, titles, [True, False, True, False], [False, False, True, True]):
        ax.axis("off")
        ax.set_xlim(-1.3, 1.3)
        ax.set_ylim(-0.3, 2.3)
        ax.set_title(title, fontsize=8)
        root = (0.0, 2.0)
        mids = [(-0.6, 1.0), (0.6, 1.0)] if state_root else [(-0.9, 1.0), (0.0, 1.0), (0.9, 1.0)]
        leaves = ([(-0.95, 0.0), (-0.25, 0.0), (0.25, 0.0), (0.95, 0.0)] if state_root
                  else [(-1.1, 0.0), (-0.7, 0.0), (-0.2, 0.0), (0.2, 0.0), (0.7, 0.0), (1.1, 0.0)])
        for m in mids:
            ax.plot(*zip(root, m), color="k", lw=1)
        for j, leaf in enumerate(leaves):
            ax.plot(*zip(mids[j * len(mids) // len(leaves)], leaf), color="k", lw=1)
        def node(p, is_state):
            if is_state:
                ax.add_patch(plt.Circle(p, 0.13, fc="white", ec="k", zorder=3))
            else:
                ax.plot(*p, "ko", ms=6, zorder=3)
        node(root, state_root)
        for m in mids:
            node(m, not state_root)
        for leaf in leaves:
            node(leaf, state_root)
        if use_max:
            y = 1.55 if state_root else 0.55
            ax.add_patch(plt.matplotlib.patches.Arc((0, y + (0.45 if state_root else 0.45)), 1.0, 0.6,
                                                    theta1=235, theta2=305, color="tab:red", lw=1.5))
            ax.text(0.55, y + 0.1, "max", color="tab:red", ha="center", fontsize=8)
        ax.text(0.17, 2.0, "s" if state_root else "s,a", fontsize=8, va="center")
    fig.tight_layout()
    return fig


def plot_student_policy(p_quit: float = 0.5, p_study_1: float = 0.5, p_study_2: float = 0.5,
                        p_study_3: float = 0.5) -> Figure:
    """V_pi of the Student MDP (gamma = 1) for a policy given by the probability of its second action in each
    state (Quit, Study, Study, Study), against V* (the dots)."""
    P, R = student_mdp()
    second = np.array([p_quit, p_study_1, p_study_2, p_study_3, 0.5])
    policy = np.stack([1 - second, second], axis=1)
    P_pi, R_pi = induced_mrp(P, R, policy)
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    try:
        V = episodic_value(P_pi, R_pi, [4])
    except ValueError:
        V = np.full(5, np.nan)
        ax.text(0.5, 0.5, "this policy never reaches Sleep:\nits undiscounted return is unbounded",
                transform=ax.transAxes, ha="center", color="tab:red")
    optimal = np.array([6.0, 6.0, 8.0, 10.0, 0.0])
    names = STUDENT_MDP_STATES[:4]
    ax.bar(names, V[:4], color="tab:blue", label=r"$V_\pi(s)$")
    ax.plot(names, optimal[:4], "D", color="tab:orange", label=r"$V_*(s)$")
    for i, v in enumerate(V[:4]):
        if np.isfinite(v):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom" if v >= 0 else "top", fontsize=8)
    labels = [f"{STUDENT_MDP_ACTIONS[i][1]} {p:.0%}" for i, p in enumerate(second[:4])]
    ax.set_xticks(range(4), [f"{n}\n({lab})" for n, lab in zip(names, labels)], fontsize=8)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_ylabel("value, gamma = 1")
    ax.set_ylim(top=12.5)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def plot_policy_enumeration(values: np.ndarray, greedy_index: int, labels: Sequence[str],
                            state_names: Sequence[str], gamma: float) -> Figure:
    """V_pi(s) of every deterministic policy (one grey line each), the greedy-on-q* policy in colour."""
    values = np.asarray(values, dtype=float)
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    x = np.arange(values.shape[1])
    for row in values:
        ax.plot(x, row, color="0.75", lw=1, marker=".")
    ax.plot(x, values[greedy_index], color="tab:red", lw=2, marker="o", label=f"greedy on q*: {labels[greedy_index]}")
    ax.set_xticks(x, state_names)
    ax.set_ylabel(r"$V_\pi(s)$")
    ax.set_title(f"all {len(values)} deterministic policies, gamma = {gamma:g}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


