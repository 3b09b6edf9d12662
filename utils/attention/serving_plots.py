"""Figures of the serving chapter: decode on the roofline, block tables, and where KV memory goes.

Pure functions of their arguments that return a Matplotlib figure (the
:mod:`utils.viz` pattern), so a page can draw them statically and with sliders.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from utils.attention.allocation import COMPONENTS, POLICIES, VLLM_FIGURE2, MemoryShares
from utils.attention.decode_cost import (decode_step_cost, decode_tokens_per_second, max_batch, param_count,
                                        params_read_per_step)
from utils.attention.kv_cache import MODELS
from utils.attention.paged_cache import PagedKVCache
from utils.gpu import hardware

POLICY_NAMES = {"max": "Orca (Max)", "pow2": "Orca (Pow2)", "oracle": "Orca (Oracle)", "paged": "paged (vLLM)"}
COMPONENT_COLORS = {"token_states": "tab:green", "reservation": "tab:olive", "internal": "tab:orange",
                    "external": "tab:red", "free": "0.85"}


def plot_decode_roofline(model: str = "LLaMA-2-7B", context: int = 2048, gpu: str = "H100-SXM",
                         precision: str = "fp16") -> Figure:
    """Left: decode steps of batch 1..1024 on ``gpu``'s roofline. Right: tokens/s against batch, with the
    batch whose caches fill the GPU's memory beside all the weights (:mod:`utils.attention.decode_cost`)."""
    config, g, n = MODELS[model], hardware.spec(gpu), params_read_per_step(model)
    peak, bw = g.flops(precision), g.hbm_bandwidth
    batches = 2 ** np.arange(0, 11)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 3.6))
    x = np.logspace(-0.5, 3.5, 200)
    left.loglog(x, np.minimum(peak, x * bw) / 1e12, color="black", lw=1)
    left.axvline(peak / bw, color="0.6", ls=":", lw=1)
    for ctx, marker, color in ((0, "o", "tab:blue"), (context, "s", "tab:red")):
        costs = [decode_step_cost(n, config, int(b), ctx) for b in batches]
        ai = np.array([c.intensity for c in costs])
        left.loglog(ai, np.minimum(peak, ai * bw) / 1e12, marker, color=color, ms=4,
                    label=f"context {ctx}" if ctx else "no cache")
        for b, a in zip(batches, ai):
            if b in (1, 32, 1024):
                left.annotate(f"B={b}", (a, min(peak, a * bw) / 1e12), fontsize=7, xytext=(3, -9),
                              textcoords="offset points")
    left.set(xlabel="arithmetic intensity (FLOPs/byte)", ylabel="attainable TFLOP/s",
             title=f"{model} decode on {gpu} ({precision})")
    left.legend(fontsize=8, loc="lower right")
    cap = max_batch(param_count(model), config, max(context, 1), gpu)
    bs = np.unique(np.round(np.logspace(0, 10, 80, base=2)).astype(int))
    for ctx, color in ((0, "tab:blue"), (context, "tab:red")):
        right.loglog(bs, [decode_tokens_per_second(n, config, int(b), ctx, gpu, precision) for b in bs],
                     color=color, label=f"context {ctx}" if ctx else "no cache")
    right.axvline(cap, color="tab:red", ls="--", lw=1)
    right.text(cap, right.get_ylim()[0] * 1.5, f" caches fill\n {g.hbm_bytes / 1e9:.0f} GB at B={cap}",
               fontsize=7, color="tab:red")
    right.set(xlabel="batch (sequences decoded together)", ylabel="tokens/s (roofline bound)",
              title="time per step = max(FLOPs/peak, bytes/bandwidth)")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_block_tables(cache: PagedKVCache, names: dict[int, str], title: str = "") -> Figure:
    """Each sequence's logical blocks (left) and the physical pool (right), arrows for the block tables.

    Logical blocks are shaded by how full they are; a pool block used by several sequences (reference
    count > 1) is hatched and labelled with its count.
    """
    fig, ax = plt.subplots(figsize=(8.0, 0.9 + 0.3 * cache.num_blocks))
    draw_block_tables(ax, cache, names, title)
    fig.tight_layout()
    return fig


def _is_live(cache: PagedKVCache, seq: int) -> bool:
    try:
        cache.length(seq)
    except ValueError:
        return False
    return True


def draw_block_tables(ax: plt.Axes, cache: PagedKVCache, names: dict[int, str], title: str = "") -> None:
    """Draw :func:`plot_block_tables`'s picture on ``ax`` (one frame of an animation)."""
    seqs = [seq for seq in names if _is_live(cache, seq)]  # sequences freed since are left out
    colors = {seq: plt.get_cmap("tab10")(i) for i, seq in enumerate(names)}
    pitch, bs = 0.4, cache.block_size
    height = cache.num_blocks * pitch
    pool_x = 1.1 * max([len(cache.block_table(s)) for s in seqs] + [4]) + 1.5
    pool_y = {b: height - (b + 0.5) * pitch for b in range(cache.num_blocks)}
    for b, y in pool_y.items():
        owners = [s for s in seqs if b in cache.block_table(s)]
        shared = cache.refcount(b) > 1
        ax.add_patch(plt.Rectangle((pool_x, y - 0.45 * pitch), 1.6, 0.9 * pitch, edgecolor="black", alpha=0.75,
                                   facecolor=colors[owners[0]] if owners else "white", hatch="//" if shared else None))
        ax.text(pool_x + 1.7, y, f"#{b}" + (f"  shared, ref {cache.refcount(b)}" if shared else ""), va="center",
                fontsize=7)
    for row, seq in enumerate(seqs):
        y = height - (row + 0.5) * height / max(len(seqs), 1)
        ax.text(-0.1, y, names[seq], ha="right", va="center", fontsize=8)
        length = cache.length(seq)
        for i, b in enumerate(cache.block_table(seq)):
            filled = min(bs, length - i * bs)
            ax.add_patch(plt.Rectangle((i * 1.1, y - 0.2), 1.0, 0.4, facecolor="white", edgecolor=colors[seq]))
            ax.add_patch(plt.Rectangle((i * 1.1, y - 0.2), filled / bs, 0.4, facecolor=colors[seq], alpha=0.75))
            ax.annotate("", (pool_x, pool_y[b]), (i * 1.1 + 1.0, y),
                        arrowprops=dict(arrowstyle="->", color=colors[seq], lw=0.8, alpha=0.8))
    ax.text(0, height + 0.15, f"logical blocks of {bs} tokens (filled part shaded)", fontsize=7)
    ax.text(pool_x, height + 0.15, "physical pool", fontsize=7)
    ax.set_xlim(-1.6, pool_x + 4.0)
    ax.set_ylim(-0.1, height + 0.5)
    ax.axis("off")
    ax.set_title(title or f"{cache.num_free_blocks} of {cache.num_blocks} blocks free, {cache.copies} copied "
                 "on write", fontsize=9)


def plot_memory_shares(results: dict[str, MemoryShares], title: str = "") -> Figure:
    """Stacked bars of where KV memory goes, simulated (left of each pair) beside the vLLM paper's Figure 2."""
    fig, ax = plt.subplots(figsize=(8.0, 3.6))
    for i, policy in enumerate(POLICIES):
        sim = results[policy]
        paper = VLLM_FIGURE2[policy]
        for x, values, alpha in ((i - 0.2, {c: getattr(sim, c) for c in (*COMPONENTS, "free")}, 0.9),
                                 (i + 0.2, {c: paper[c].value for c in COMPONENTS if c in paper}, 0.45)):
            bottom = 0.0
            for part, share in values.items():
                ax.bar(x, 100 * share, 0.36, bottom=100 * bottom, color=COMPONENT_COLORS[part], alpha=alpha,
                       edgecolor="black", lw=0.4, label=part.replace("_", " ") if (i, x < i) == (0, True) else None)
                bottom += share
            ax.text(x, 100 * values["token_states"] / 2, f"{100 * values['token_states']:.1f}", ha="center",
                    fontsize=7)
        ax.text(i - 0.2, 101, "sim", ha="center", fontsize=7)
        ax.text(i + 0.2, 101, "paper", ha="center", fontsize=7)
    ax.set_xticks(range(len(POLICIES)), [POLICY_NAMES[p] for p in POLICIES])
    ax.set_ylabel("share of KV-cache memory (%)")
    ax.set_ylim(0, 108)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title or "Where KV memory goes: simulated (solid) and arXiv:2309.06180, Figure 2 (pale)",
                 fontsize=9)
    fig.tight_layout()
    return fig
