"""Figures of the planning chapter: the device mesh, a plan's memory and time bars, planner vs published runs.

Pure functions of their arguments that return a Matplotlib figure (the
:mod:`utils.viz` pattern); the numbers come from :mod:`utils.parallel.planning.planner`.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from utils.parallel.planning.planner import BLIND_SPOTS, COMPUTE_EFFICIENCY, Layout, Plan, plan
from utils.parallel.planning.published_runs import MEGATRON_RUNS, PUBLISHED_RUNS, Comparison
from utils.validate import check_positive_int

_GB = 1e9
MEMORY_COLOURS = {"parameters": "tab:blue", "gradients": "tab:orange", "optimizer": "tab:green",
                  "activations": "tab:red", "recompute working set": "tab:pink", "logits": "tab:purple"}
TIME_COLOURS = {"compute": "tab:blue", "pipeline bubble": "lightgrey", "TP communication": "tab:orange",
                "PP communication": "tab:green", "DP communication (exposed)": "tab:red"}


def mesh_rank(dp_index: int, pp_index: int, tp_index: int, pp: int, tp: int) -> int:
    """Global rank of mesh coordinate (dp, pp, tp) with TP fastest: ``tp_i + tp (pp_i + pp dp_i)``."""
    return tp_index + tp * (pp_index + pp * dp_index)


def plot_device_mesh(dp: int = 2, pp: int = 2, tp: int = 4, nvlink_domain: int = 8) -> Figure:
    """Every rank of a ``dp x pp x tp`` mesh, coloured by the NVLink domain (node) it sits in.

    Columns: DP replicas side by side, TP ranks within each; rows: pipeline
    stages. A black bar joins a TP group, an arrow a pipeline step.
    """
    for name, value in (("dp", dp), ("pp", pp), ("tp", tp), ("nvlink_domain", nvlink_domain)):
        check_positive_int(name, value)
    if dp * pp * tp > 256:
        raise ValueError(f"draw at most 256 ranks, got dp x pp x tp = {dp * pp * tp}")
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(min(10.0, 1.2 + 0.55 * dp * (tp + 0.6)), 1.0 + 0.75 * pp))
    for d in range(dp):
        for p in range(pp):
            y = pp - 1 - p
            x0 = d * (tp + 0.6)
            for t in range(tp):
                rank = mesh_rank(d, p, t, pp, tp)
                node = rank // nvlink_domain
                ax.add_patch(Rectangle((x0 + t, y), 0.9, 0.7, color=cmap(node % 20), alpha=0.85))
                ax.text(x0 + t + 0.45, y + 0.35, str(rank), ha="center", va="center", fontsize=8)
            if tp > 1:
                ax.plot([x0 + 0.45, x0 + tp - 0.55], [y + 0.78, y + 0.78], color="black", lw=2)
            if p < pp - 1:
                ax.annotate("", xy=(x0 + 0.45, y - 0.3 + 0.7 - 0.7), xytext=(x0 + 0.45, y),
                            arrowprops=dict(arrowstyle="->", color="black"))
        ax.text(d * (tp + 0.6) + tp / 2 - 0.05, pp + 0.1, f"DP replica {d}", ha="center", fontsize=8)
    ax.set_xlim(-0.2, dp * (tp + 0.6))
    ax.set_ylim(-0.3, pp + 0.5)
    ax.set_yticks([pp - 1 - p + 0.35 for p in range(pp)], [f"stage {p}" for p in range(pp)])
    ax.set_xticks([])
    n_nodes = -(-dp * pp * tp // nvlink_domain)
    ax.set_title(f"{dp * pp * tp} ranks, dp={dp} x pp={pp} x tp={tp}; colour = node of {nvlink_domain} GPUs "
                 f"({n_nodes} node{'s' if n_nodes > 1 else ''})", fontsize=9)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def _draw_plan(axes: Sequence, p: Plan) -> None:
    mem_ax, time_ax = axes
    left = 0.0
    for kind, nbytes in p.memory.items():
        if nbytes > 0:
            mem_ax.barh(0, nbytes / _GB, left=left, color=MEMORY_COLOURS[kind], label=kind)
            left += nbytes / _GB
    mem_ax.axvline(p.capacity_bytes / _GB, color="black", ls="--", lw=1)
    mem_ax.text(p.capacity_bytes / _GB, 0.0, " HBM", va="center", fontsize=8)
    verdict = "fits" if p.fits else "does NOT fit"
    mem_ax.set_title(f"memory on the fullest stage ({p.stage}): {p.memory_bytes / _GB:.1f} GB, {verdict}", fontsize=9)
    mem_ax.set_xlabel("GB per GPU")
    mem_ax.set_xlim(0, max(left, p.capacity_bytes / _GB) * 1.1)
    left = 0.0
    for kind, seconds in p.time.items():
        if seconds > 0:
            time_ax.barh(0, seconds, left=left, color=TIME_COLOURS[kind], label=kind)
            left += seconds
    time_ax.set_title(f"step {p.step_seconds:.2f} s: {p.tflops_per_gpu:.0f} TFLOP/s per GPU, MFU {p.mfu:.0%}, "
                      f"{p.tokens_per_s / p.n_gpus:,.0f} tokens/s per GPU", fontsize=9)
    time_ax.set_xlabel("seconds per step")
    for ax in axes:
        ax.set_yticks([])
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)


def plot_plan(p: Plan, title: str = "") -> Figure:
    """A plan as two stacked bars: bytes per GPU by kind against HBM, and a step's seconds by part."""
    fig, axes = plt.subplots(2, 1, figsize=(9.0, 3.4))
    _draw_plan(axes, p)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _run(name: str):
    for run in PUBLISHED_RUNS:
        if run.name == name:
            return run
    raise ValueError(f"unknown run {name!r}; known: {', '.join(r.name for r in PUBLISHED_RUNS)}")


def plot_planner(run: str = "GPT 145.6B", tp: int = 8, pp: int = 8, micro_batch: int = 1, v: int = 1,
                 zero_stage: int = 0, sequence_parallel: bool = False, recompute: str = "full",
                 efficiency: float = COMPUTE_EFFICIENCY) -> Figure:
    """The planner on a published run's model and cluster with another layout (DP takes the remaining GPUs).

    An impossible layout draws the planner's error message instead of raising, so sliders never break.
    """
    r = _run(run)
    fig, axes = plt.subplots(2, 1, figsize=(9.0, 3.4))
    try:
        if r.cluster.n_gpus % (tp * pp):
            raise ValueError(f"tp x pp = {tp * pp} must divide the {r.cluster.n_gpus} GPUs")
        layout = Layout(dp=r.cluster.n_gpus // (tp * pp), tp=tp, pp=pp, micro_batch=micro_batch,
                        global_batch=r.layout.global_batch, v=v, zero_stage=zero_stage,
                        sequence_parallel=sequence_parallel, recompute=recompute,
                        balance_embedding=r.layout.balance_embedding, grad_bytes=r.layout.grad_bytes)
        _draw_plan(axes, plan(r.model, r.cluster, layout, efficiency=efficiency))
        fig.suptitle(f"{r.name} on {r.cluster.n_gpus:,} {r.cluster.gpu}: dp={layout.dp}, tp={tp}, pp={pp}, "
                     f"m={layout.microbatches}", fontsize=10)
    except ValueError as err:
        for ax in axes:
            ax.axis("off")
        axes[0].text(0.0, 0.5, f"not a valid layout:\n{err}", fontsize=9, wrap=True)
    fig.tight_layout()
    return fig


def plot_published_comparison(rows: Sequence[Comparison], bound: float = 0.25, blind_spots: bool = True) -> Figure:
    """Published vs predicted TFLOP/s per GPU (left), the relative error (middle) and what the planner cannot see.

    Rows of Megatron's Table 1, on which the efficiency is fitted, are drawn in
    sample; the others (Llama 3) out of sample. ``blind_spots`` adds
    :data:`utils.parallel.planning.planner.BLIND_SPOTS` as a table on the right.
    """
    names = [row.run.name.replace("Llama 3 405B, ", "Llama 3\n") for row in rows]
    published = [row.run.tflops_per_gpu.value for row in rows]
    predicted = [row.predicted_tflops_per_gpu for row in rows]
    errors = [100 * row.relative_error for row in rows]
    fitted = [row.run in MEGATRON_RUNS for row in rows]
    widths = (1.0, 1.0, 1.5) if blind_spots else (1.0, 1.0)
    fig, axes = plt.subplots(1, len(widths), figsize=(14.0 if blind_spots else 9.5, 3.9),
                             gridspec_kw={"width_ratios": widths})
    left, right = axes[0], axes[1]
    y = range(len(rows))
    left.barh([i + 0.2 for i in y], published, height=0.4, color="tab:grey", label="published")
    left.barh([i - 0.2 for i in y], predicted, height=0.4, color=["tab:blue" if f else "tab:purple" for f in fitted],
              label="planner")
    left.set_yticks(list(y), names, fontsize=7)
    left.invert_yaxis()
    left.set_xlabel("TFLOP/s per GPU")
    left.legend(fontsize=8)
    right.axvspan(-100 * bound, 100 * bound, color="tab:green", alpha=0.12)
    colours = ["tab:red" if abs(e) > 100 * bound else ("tab:blue" if f else "tab:purple")
               for e, f in zip(errors, fitted)]
    right.barh(list(y), errors, color=colours)
    right.axvline(0, color="black", lw=0.8)
    right.set_yticks(list(y), [""] * len(rows))
    right.invert_yaxis()
    right.set_xlabel("planner / published - 1 (%)")
    handles = [Patch(color="tab:green", alpha=0.12, label=f"±{bound:.0%}"),
               Patch(color="tab:blue", label="in sample (fitted)"), Patch(color="tab:purple", label="out of sample")]
    right.legend(handles=handles, fontsize=7)
    if blind_spots:
        table = axes[2]
        table.axis("off")
        table.set_title("what the planner cannot see", fontsize=9, loc="left")
        for i, (what, _) in enumerate(BLIND_SPOTS):
            table.text(0.0, 1 - (i + 0.5) / len(BLIND_SPOTS), f"• {what}", fontsize=8, va="center",
                       transform=table.transAxes)
    fig.tight_layout()
    return fig
