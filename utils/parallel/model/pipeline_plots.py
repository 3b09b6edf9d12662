"""Figures of :mod:`utils.parallel.model.pipeline`: a schedule's Gantt chart, its animation, measured against predicted.

Pure functions of their parameters (the book's widget pattern, :mod:`utils.viz`):
:func:`plot_schedule` draws stages against time, forwards in blue and
backwards in green (darker shades for later chunks), each box labelled with
its micro-batch; :func:`animate_schedule` fills the same chart in step by step;
:func:`plot_zero_bubble` draws the split-backward schedules of
:mod:`utils.parallel.model.zero_bubble` (weight gradients in orange);
:func:`plot_dualpipe_placement` sketches DualPipe's two-way placement.
"""

from __future__ import annotations

from typing import Any, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from utils import viz
from utils.parallel.model import pipeline as pp
from utils.parallel.model import zero_bubble as zb

_F = ["#9ecae1", "#4292c6", "#2171b5", "#08519c"]  # forward, by chunk
_B = ["#a1d99b", "#41ab5d", "#238b45", "#006d2c"]  # backward (input gradient, B), by chunk
_W = ["#fdae6b", "#f16913", "#d94801", "#8c2d04"]  # weight gradient (W) of a split backward, by chunk


def draw_ops(ax: Any, ops: Sequence[pp.Op], n_stages: int, until: float | None = None,
             labels: bool = True) -> None:
    """Draw ``ops`` (those started before ``until``, clipped at it) on ``ax``: one row per stage, stage 0 on top."""
    horizon = pp.makespan(ops)
    for o in ops:
        if until is not None and o.start >= until:
            continue
        end = o.end if until is None else min(o.end, until)
        color = {"F": _F, "B": _B, "W": _W}[o.kind][o.chunk % 4]
        # The bar barh would draw, added without barh's update of the data limits (they are set below):
        # the same pixels, at a fraction of the cost for the hundreds of bars an animation or widget draws.
        ax.add_artist(plt.Rectangle((o.start, o.stage - 0.4), end - o.start, 0.8, facecolor=color,
                                    edgecolor="white", linewidth=0.6))
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


def plot_zero_bubble(kind: str = "zb-h1", n_stages: int = 4, n_microbatches: int = 8, t_forward: float = 1.0,
                     t_input_grad: float = 1.0, t_weight_grad: float = 1.0) -> Figure:
    """Gantt chart of ``zero_bubble.schedule(...)``: F blue, B (input gradient) green, W (weight gradient) orange.

    The title gives stage 0's bubble (its idle time between its own first and
    last operation, the paper's measure) against Table 2 of arXiv:2401.10241,
    and stage 0's peak stored micro-batches (F started, W not ended).
    """
    ops = zb.schedule(kind, n_stages, n_microbatches, t_forward, t_input_grad, t_weight_grad)
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * n_stages + 1.4))
    draw_ops(ax, ops, n_stages, labels=n_stages * n_microbatches <= 96)
    ax.set_xlabel("time (units of the times given)")
    bubble = zb.stage_bubble(ops)[0]
    paper = zb.paper_bubble(kind, n_stages, t_forward, t_input_grad, t_weight_grad)
    assumed = (n_microbatches >= (2 * n_stages - 1 if kind == "zb-h2" else n_stages)
               and (kind == "1f1b" or t_weight_grad <= min(t_forward, t_input_grad)))
    ax.set_title(f"{kind}, p={n_stages}, m={n_microbatches}: stage 0 idles {bubble:.3g} "
                 f"(Table 2: {paper:.3g}), holds up to {zb.peak_activations(ops)[0]:g} micro-batches"
                 + ("" if assumed else "\nTable 2 assumes m >= p (ZB-H2: 2p - 1) and W no longer than F or B"),
                 fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c[0]) for c in (_F, _B, _W)]
    ax.legend(handles, ["F", "B (input grad)", "W (weight grad)"], fontsize=7, loc="upper right",
              bbox_to_anchor=(1.0, -0.22), ncol=3)
    fig.tight_layout()
    return fig


def plot_dualpipe_placement(n_devices: int = 8) -> Figure:
    """DualPipe's placement (DeepSeek-V3, arXiv:2412.19437, section 3.2.1): each device holds two stages.

    Device ``d`` holds stage ``d`` of one copy of the model, fed from device 0
    (micro-batches flowing down), and stage ``p - 1 - d`` of a second copy, fed
    from device ``p - 1`` (flowing up). Beside it, 1F1B's one stage per device.
    """
    p = n_devices
    if p < 2 or p % 2:
        raise ValueError(f"n_devices must be an even number >= 2 (DualPipe pairs the ends), got {p}")
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 0.32 * p + 1.2), sharey=True)
    for ax, dual in zip(axes, (False, True)):
        for d in range(p):
            ax.add_patch(plt.Rectangle((0.1, d - 0.4), 0.35 if dual else 0.8, 0.8, color=_F[1]))
            ax.text(0.275 if dual else 0.5, d, f"stage {d}", ha="center", va="center", fontsize=7, color="white")
            if dual:
                ax.add_patch(plt.Rectangle((0.55, d - 0.4), 0.35, 0.8, color=_W[1]))
                ax.text(0.725, d, f"stage {p - 1 - d}", ha="center", va="center", fontsize=7, color="white")
        ax.annotate("", xy=(0.05, p - 0.5), xytext=(0.05, -0.5), arrowprops=dict(arrowstyle="->", lw=0.8))
        if dual:  # the second copy's micro-batches enter at the last device and flow up
            ax.annotate("", xy=(0.95, -0.5), xytext=(0.95, p - 0.5), arrowprops=dict(arrowstyle="->", lw=0.8))
        ax.set_xlim(0, 1)
        ax.set_xticks([])
        ax.set_title("DualPipe: two copies, two directions" if dual else "1F1B / ZB: one stage per device",
                     fontsize=9)
    axes[0].set_ylim(p - 0.5 + 0.3, -0.5 - 0.3)
    axes[0].set_yticks(range(p), [f"device {d}" for d in range(p)])
    fig.tight_layout()
    return fig
