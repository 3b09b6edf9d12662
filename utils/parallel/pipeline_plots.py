"""Figures of :mod:`utils.parallel.pipeline`: a schedule's Gantt chart, its animation, measured against predicted.

Pure functions of their parameters (the book's widget pattern, :mod:`utils.viz`):
:func:`plot_schedule` draws stages against time, forwards in blue and
backwards in green (darker shades for later chunks), each box labelled with
its micro-batch; :func:`animate_schedule` fills the same chart in step by step.
"""

from __future__ import annotations

from typing import Any, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from utils import viz
from utils.parallel import pipeline as pp

_F = ["#9ecae1", "#4292c6", "#2171b5", "#08519c"]  # forward, by chunk
_B = ["#a1d99b", "#41ab5d", "#238b45", "#006d2c"]  # backward, by chunk


def draw_ops(ax: Any, ops: Sequence[pp.Op], n_stages: int, until: float | None = None,
             labels: bool = True) -> None:
    """Draw ``ops`` (those started before ``until``, clipped at it) on ``ax``: one row per stage, stage 0 on top."""
    horizon = pp.makespan(ops)
    for o in ops:
        if until is not None and o.start >= until:
            continue
        end = o.end if until is None else min(o.end, until)
        color = (_F if o.kind == "F" else _B)[o.chunk % 4]
        ax.barh(o.stage, end - o.start, left=o.start, height=0.8, color=color, edgecolor="white", linewidth=0.6)
        if labels and end - o.start > 0.5 * (o.end - o.start):
            ax.text((o.start + end) / 2, o.stage, str(o.microbatch), ha="center", va="center", fontsize=7)
    ax.set_xlim(0, horizon)
    ax.set_ylim(n_stages - 0.5, -0.5)
    ax.set_yticks(range(n_stages), [f"stage {s}" for s in range(n_stages)])
    ax.set_xlabel("time (one micro-batch's forward through a stage = 1)")


def plot_schedule(kind: str = "1f1b", n_stages: int = 4, n_microbatches: int = 8, n_chunks: int = 1,
                  t_forward: float = 1.0, t_backward: float = 2.0) -> Figure:
    """Gantt chart of ``pipeline.schedule(...)`` with its bubble and peak stored micro-batches in the title."""
    ops = pp.schedule(kind, n_stages, n_microbatches, n_chunks, t_forward, t_backward)
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * n_stages + 1.4))
    draw_ops(ax, ops, n_stages, labels=n_stages * n_microbatches * n_chunks <= 256)
    bubble = pp.bubble_fraction(ops)
    peaks = pp.peak_in_flight(ops)
    stored = f"{peaks[0] / n_chunks:g}" if n_chunks > 1 else f"{peaks[0]}"
    ax.set_title(f"{kind}, p={n_stages}, m={n_microbatches}" + (f", v={n_chunks}" if n_chunks > 1 else "")
                 + f": bubble {bubble:.1%} (closed form "
                 f"{pp.ideal_bubble_fraction(kind, n_stages, n_microbatches, n_chunks):.1%}), "
                 f"stage 0 stores {stored} micro-batches", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=_F[0]), plt.Rectangle((0, 0), 1, 1, color=_B[0])]
    ax.legend(handles, ["forward", "backward"], fontsize=7, loc="upper right", bbox_to_anchor=(1.0, -0.22), ncol=2)
    fig.tight_layout()
    return fig


def animate_schedule(kind: str = "1f1b", n_stages: int = 4, n_microbatches: int = 8, n_chunks: int = 1,
                     t_forward: float = 1.0, t_backward: float = 2.0, n_steps: int = 40) -> Any:
    """The schedule filling in over time, as a scrubbable :func:`utils.viz.animate` (HTML, no kernel needed)."""
    ops = pp.schedule(kind, n_stages, n_microbatches, n_chunks, t_forward, t_backward)
    horizon = pp.makespan(ops)

    def draw(ax: Any, step: int) -> None:
        now = horizon * (step + 1) / n_steps
        draw_ops(ax, ops, n_stages, until=now)
        ax.axvline(now, color="black", lw=0.8)
        held = [sum(1 for o in ops if o.stage == s and o.kind == "F" and o.start < now)
                - sum(1 for o in ops if o.stage == s and o.kind == "B" and o.end <= now) for s in range(n_stages)]
        ax.set_title(f"{kind}: t = {now:.1f}; micro-batches stored per stage: {held}", fontsize=9)

    return viz.animate(draw, n_steps, figsize=(7.0, 0.4 * n_stages + 1.3), interval_ms=300)


def plot_measured_vs_predicted(measured: dict[str, Sequence[tuple[float, float]]], n_stages: int,
                               n_microbatches: int, title: str = "") -> Figure:
    """Measured per-rank compute intervals (``{kind: [(start, end), ...] per rank}``) above the simulation.

    ``measured[kind][rank]`` is a list of (start, end) in seconds; the simulated
    schedule is drawn below it with the measured mean F and B times.
    """
    fig, axes = plt.subplots(len(measured), 1, figsize=(7.5, 1.2 + 0.5 * n_stages * len(measured)), squeeze=False)
    for ax, (kind, per_rank) in zip(axes[:, 0], measured.items()):
        for rank, intervals in enumerate(per_rank):
            for k, start, end in intervals:
                ax.barh(rank, end - start, left=start, height=0.8, color=_F[1] if k == "F" else _B[1],
                        edgecolor="white", linewidth=0.5)
        ax.set_ylim(n_stages - 0.5, -0.5)
        ax.set_yticks(range(n_stages), [f"rank {r}" for r in range(n_stages)])
        ax.set_title(f"{kind}, measured ({n_stages} ranks, m={n_microbatches}) {title}", fontsize=9)
    axes[-1, 0].set_xlabel("seconds from the common start")
    fig.tight_layout()
    return fig
