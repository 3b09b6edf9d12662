"""Figures of chapter ``04-dynamic-programming``: GridWorld values as a heat map, greedy actions as arrows.

Pure functions of their arguments: ``draw_*`` draw on a given Matplotlib axes
(for :func:`utils.viz.animate`), ``plot_*`` return a new figure.
"""

from __future__ import annotations

from typing import Any, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from utils.rl.gridworld import ACTIONS, GridWorld, gridworld_mdp, value_iteration_history
from utils.rl.mdp import as_array


def greedy_actions(q: Any, atol: float = 1e-6) -> list[list[int]]:
    """Per state, every action whose ``q`` is within ``atol`` of the best (all tied arrows are drawn)."""
    q = as_array(q, "q")
    return [list(np.flatnonzero(row >= row.max() - atol)) for row in q]


def draw_gridworld(ax: Any, world: GridWorld, V: Any, q: Any = None, title: str = "",
                   vmin: float | None = None, vmax: float | None = None, numbers: bool = True,
                   fmt: str = "{:.1f}") -> None:
    """Heat map of ``V`` on ``ax`` (walls black, terminals hatched), with greedy arrows from ``q`` if given."""
    grid = world.to_grid(V)
    cmap = plt.get_cmap("RdYlGn").copy()
    cmap.set_bad("black")
    ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=vmin, vmax=vmax)
    terminals = set(world.terminals)
    arrows = greedy_actions(q) if q is not None else None
    for s, (r, c) in enumerate(world.states):
        if (r, c) in terminals:
            ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, hatch="//", edgecolor="gray", lw=0))
        if numbers:
            label = fmt.format(grid[r, c])
            label = label[1:] if label.startswith("-") and float(label) == 0 else label  # no "-0.0"
            ax.text(c, r + (0.28 if arrows else 0.0), label, ha="center", va="center", fontsize=7)
        if arrows and (r, c) not in terminals:
            for a in arrows[s]:
                dr, dc = ACTIONS[a]
                ax.arrow(c, r - 0.08, 0.27 * dc, 0.27 * dr, head_width=0.12, head_length=0.1,
                         length_includes_head=True, color="black", lw=0.8)
    for (r, c), reward in world.bonus.items():
        ax.text(c, r - 0.32, f"{reward:+g}", ha="center", va="center", fontsize=7, color="navy")
    ax.set_xticks(np.arange(world.cols + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(world.rows + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", lw=1)
    ax.tick_params(which="both", bottom=False, left=False, labelbottom=False, labelleft=False)
    ax.set_title(title, fontsize=9)


def plot_gridworld(world: GridWorld, V: Any, q: Any = None, title: str = "", numbers: bool = True,
                   fmt: str = "{:.1f}") -> Figure:
    """One GridWorld heat map (see :func:`draw_gridworld`) as a figure."""
    fig, ax = plt.subplots(figsize=(0.75 * world.cols + 1.2, 0.75 * world.rows + 0.6))
    draw_gridworld(ax, world, V, q, title, numbers=numbers, fmt=fmt)
    fig.tight_layout()
    return fig


def plot_solved_gridworld(world: GridWorld, gamma: float = 0.9) -> Figure:
    """Optimal values (heat map) and greedy policy (arrows) of ``world`` by value iteration at ``gamma``."""
    P, R = gridworld_mdp(world)
    V, _, history = value_iteration_history(P, R, gamma, tol=1e-9)
    title = (f"V* and greedy policy: gamma={gamma:g}, slip={world.slip:g}, step reward={world.step_reward:g} "
             f"({len(history) - 1} sweeps)")
    return plot_gridworld(world, V, R + gamma * P @ V, title)


def plot_convergence(vi_errors: Sequence[float], gamma: float, pi_sweeps: Sequence[int] = (),
                     pi_errors: Sequence[float] = ()) -> Figure:
    """``max|V_k - V*|`` of value iteration per sweep against the bound ``gamma^k |V_0 - V*|``.

    If given, policy iteration's error after each iteration is drawn at the cumulative number of
    evaluation sweeps it had spent (``pi_sweeps``).
    """
    errors = np.asarray(vi_errors, dtype=float)
    k = np.arange(len(errors))
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    ax.semilogy(k, np.maximum(errors, 1e-16), label="value iteration: $\\|V_k - V^*\\|_\\infty$")
    ax.semilogy(k, errors[0] * gamma ** k, "--", color="gray", label=f"bound $\\gamma^k\\|V_0 - V^*\\|$, γ={gamma:g}")
    if len(pi_sweeps):
        ax.semilogy(pi_sweeps, np.maximum(pi_errors, 1e-16), "o-", color="tab:red",
                    label="policy iteration (after each improvement)")
    ax.set(xlabel="sweeps over the states", ylabel="max error", ylim=(1e-11, None))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_backup_timings(sizes: Sequence[int], seconds: dict[str, Sequence[float]], title: str) -> Figure:
    """Measured seconds against the number of states S, one line per method (log-log), for lab 01."""
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for (name, values), marker in zip(seconds.items(), "os^vd"):
        ax.loglog(sizes, values, marker=marker, label=name)
    ax.set(xlabel="states S", ylabel="seconds", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
