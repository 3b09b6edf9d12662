"""Figures of the chapter "Serving on many GPUs", drawn from :mod:`utils.serving.many_gpus.deployment`.

Pure functions of their arguments that return a Matplotlib figure (the :mod:`utils.viz` pattern).
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from utils.serving.many_gpus import deployment as d
from utils.serving.many_gpus.published_deployments import Comparison

TP_COLORS = {1: "tab:gray", 2: "tab:orange", 4: "tab:green", 8: "tab:blue"}
"""Tensor-parallel sizes drawn: those inside one 8-GPU NVLink node."""


def plot_tp_pareto(model: str = "Llama-3-70B", context: int = 2048, tpot_slo_ms: float = 50.0,
                   gpu: str = "H100-SXM") -> Figure:
    """Decode tokens/s per GPU against TPOT for tensor-parallel layouts of a dense model, batch growing along each
    curve until the caches no longer fit; the star is the largest batch within the TPOT target."""
    shape = d.dense_shape(model)
    fig, ax = plt.subplots(figsize=(7.6, 4.2))
    batches = [2 ** i for i in range(0, 13)]
    for tp, color in TP_COLORS.items():
        layout = d.Layout(tp=tp)
        pts = []
        for b in batches:
            try:
                pts.append((d.tpot_seconds(shape, layout, b, context, gpu),
                            d.tokens_per_gpu_per_s(shape, layout, b, context, gpu)))
            except ValueError:  # weights or caches do not fit
                break
        if not pts:
            continue
        t, r = np.array(pts).T
        kv = d.kv_bytes_per_token_per_gpu(shape, layout) / 1024
        ax.loglog(t * 1e3, r, "o-", ms=3, color=color, label=f"TP={tp}: {kv:.0f} KiB of cache per token per GPU")
        best, rate = d.best_at_tpot(shape, layout, context, tpot_slo_ms / 1e3, gpu)
        if best:
            ax.loglog(d.tpot_seconds(shape, layout, best, context, gpu) * 1e3, rate, "*", ms=12, color=color,
                      mec="black")
    ax.axvline(tpot_slo_ms, color="0.4", ls="--", lw=1)
    ax.set(xlabel="time per output token (ms)", ylabel="decode tokens/s per GPU",
           title=f"{model} on {gpu} (bf16), {context}-token contexts: stars at the largest batch within "
                 f"{tpot_slo_ms:g} ms")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_step_breakdown(steps: dict[str, d.Step]) -> Figure:
    """One horizontal stacked bar per layout: the seconds of each compute part, and communication beside it."""
    fig, ax = plt.subplots(figsize=(9.6, 0.9 + 0.55 * len(steps)))
    colors = {"attention weights": "tab:blue", "attention (cache)": "tab:red",
              "dense FFN + shared experts + LM head": "tab:olive", "routed experts": "tab:green"}
    for i, (name, s) in enumerate(steps.items()):
        left = 0.0
        for part, color in colors.items():
            width = 1e3 * s.parts.get(part, 0.0)
            ax.barh(i + 0.18, width, left=left, height=0.34, color=color, label=part if i == 0 else None)
            left += width
        ax.barh(i - 0.18, 1e3 * s.comm, height=0.34, color="0.55", hatch="//",
                label="communication (overlapped)" if i == 0 else None)
    ax.set_yticks(range(len(steps)), list(steps), fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="ms per decode step on one GPU (upper bar: network; lower bar: the compute parts)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def plot_published(comparisons: Sequence[Comparison]) -> Figure:
    """Each published deployment's tokens/s per node beside the calculator's roofline bound for its setup."""
    fig, ax = plt.subplots(figsize=(9.0, 0.8 + 0.5 * len(comparisons)))
    y = np.arange(len(comparisons))
    ax.barh(y - 0.18, [c.bound_per_node for c in comparisons], height=0.34, color="0.8", label="roofline bound")
    ax.barh(y + 0.18, [c.row.tokens_per_s_per_node.value for c in comparisons], height=0.34,
            color=["tab:blue" if c.row.phase == "decode" else "tab:green" for c in comparisons], label="published")
    for yi, c in zip(y, comparisons):
        ax.text(c.row.tokens_per_s_per_node.value, yi + 0.18, f" {100 * c.achieved:.0f}%", va="center", fontsize=7)
    ax.set_yticks(y, [c.row.name for c in comparisons], fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="tokens/s per node of 8 GPUs (decode: output; prefill: input)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig
