"""Figures of continuous batching: which request ran what in each step of an engine.

Drawn from :attr:`utils.serving.engine.EngineStats.schedule`, the engine's own
record, so a figure shows what the code did, not a sketch of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from utils.serving.engine import StepRecord

__all__ = ["PHASE_COLORS", "draw_schedule", "plot_schedule"]

PHASE_COLORS = {"prefill": "#e69f00", "decode": "#0072b2"}
"""Orange for prompt (or recomputed) tokens, blue for one decoded token."""


def draw_schedule(ax: Axes, schedule: Sequence[StepRecord], upto: int | None = None, budget: int | None = None,
                  title: str = "") -> None:
    """Steps across, requests down: a cell per chunk, orange (prefill, shaded by its share of ``budget``) or
    blue (decode); an ``x`` where a request was preempted. Only steps ``< upto`` are drawn (all by default)."""
    steps = schedule if upto is None else schedule[:upto]
    requests = sorted({rid for record in schedule for rid, _, _ in record.chunks})
    row = {rid: i for i, rid in enumerate(requests)}
    for step, record in enumerate(steps):
        for rid, n, phase in record.chunks:
            alpha = 1.0 if phase == "decode" or not budget else 0.35 + 0.65 * min(1.0, n / budget)
            ax.add_patch(plt.Rectangle((step, row[rid] - 0.4), 0.95, 0.8, color=PHASE_COLORS[phase], alpha=alpha,
                                       linewidth=0))
            if phase == "prefill" and len(schedule) <= 60:
                ax.text(step + 0.47, row[rid], str(n), ha="center", va="center", fontsize=6)
        for rid in record.preempted:
            ax.plot(step + 0.47, row[rid], marker="x", color="#d55e00", markersize=8, mew=2)
    ax.set_xlim(0, max(len(schedule), 1))
    ax.set_ylim(len(requests) - 0.5, -0.5)
    ax.set_yticks(range(len(requests)), [f"req {rid}" for rid in requests], fontsize=7)
    ax.set_xlabel("engine step")
    handles = [Patch(color=c, label=p) for p, c in PHASE_COLORS.items()]
    if any(record.preempted for record in schedule):
        handles.append(plt.Line2D([], [], marker="x", color="#d55e00", linestyle="", mew=2, label="preempted"))
    ax.legend(handles=handles, loc="lower right", fontsize=7, framealpha=0.9)
    if upto is not None and 0 < upto <= len(schedule):
        record = schedule[upto - 1]
        used = f"{record.num_tokens} tokens" + (f" of a budget of {budget}" if budget else "")
        ax.set_title(f"{title}step {upto - 1}: {len(record.chunks)} requests, {used}".strip(), fontsize=9)
    elif title:
        ax.set_title(title, fontsize=9)


def plot_schedule(schedule: Sequence[StepRecord], budget: int | None = None, title: str = "",
                  figsize: tuple[float, float] = (7.0, 3.2)) -> Figure:
    """The whole schedule of a run as one figure (see :func:`draw_schedule`)."""
    fig, ax = plt.subplots(figsize=figsize)
    draw_schedule(ax, schedule, budget=budget, title=title)
    fig.tight_layout()
    return fig
