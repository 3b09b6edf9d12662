"""Figures of capstone 1: which rank holds which token, and what one step moves on each group."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from utils.capstone.mesh import Mesh
from utils.capstone.parallel_4d import local_tokens
from utils.capstone.traffic import Row
from utils.validate import check_positive_int


def token_owners(seq_len: int, tp: int, cp: int) -> np.ndarray:
    """``owner[p]``: the ``(cp_i, tp_i)`` rank, as ``cp_i * tp + tp_i``, holding position ``p`` between blocks.

    Context rank ``c`` holds zig-zag chunks ``c`` and ``2 cp - 1 - c``; tensor rank ``t`` the ``t``-th slice of
    that share, in the order the share is stored (:func:`utils.capstone.parallel_4d.local_tokens`).
    """
    for name, n in (("seq_len", seq_len), ("tp", tp), ("cp", cp)):
        check_positive_int(name, n)
    if seq_len % (2 * cp) or (seq_len // cp) % tp:
        raise ValueError(f"seq_len={seq_len} must split into 2*cp={2 * cp} chunks and each share of "
                         f"{seq_len / cp:g} tokens into tp={tp} slices")
    mesh = Mesh(tp=tp, cp=cp)
    owner = np.empty(seq_len, dtype=int)
    for rank in range(mesh.world_size):  # rank = tp_i + tp * cp_i, the mesh's order
        owner[local_tokens(torch.arange(seq_len)[None], mesh, rank)[0].numpy()] = rank
    return owner


def plot_token_owners(seq_len: int = 32, tp: int = 2, cp: int = 2) -> Figure:
    """One row of ``seq_len`` positions, coloured by the (context, tensor) rank that holds each between blocks."""
    owner = token_owners(seq_len, tp, cp)
    fig, ax = plt.subplots(figsize=(max(6.0, seq_len * 0.32), 1.9))
    cmap = plt.get_cmap("tab20" if tp * cp > 10 else "tab10")
    for p, o in enumerate(owner):
        ax.add_patch(plt.Rectangle((p, 0), 1, 1, color=cmap(o % cmap.N), ec="white"))
        if seq_len <= 32:
            ax.text(p + 0.5, 0.5, f"c{o // tp}\nt{o % tp}", ha="center", va="center", fontsize=7)
    ax.set_xlim(0, seq_len)
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.set_xlabel("token position")
    ax.set_title(f"who holds each token between blocks: cp={cp} (zig-zag), tp={tp} (sequence parallel)")
    fig.tight_layout()
    return fig


def plot_step_traffic(rows: Sequence[Row], title: str = "one step on one rank") -> Figure:
    """Measured wire bytes per (group, operation) next to part 2's formulas."""
    if not rows:
        raise ValueError("rows must hold at least one (group, operation) row")
    labels = [f"{r.group}\n{r.op}" for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 * len(rows)), 3.4))
    ax.bar(x - 0.2, [r.measured / 1024 for r in rows], 0.4, label="measured")
    ax.bar(x + 0.2, [r.predicted / 1024 for r in rows], 0.4, label="part 2's formula")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("KiB sent")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def layout_table(mesh: Mesh, rank: int) -> list[tuple[str, list[int]]]:
    """``[(dims, ranks of rank's group along dims)]`` for each single dimension and data x context."""
    return [("+".join(d), mesh.group_of(rank, d)) for d in (("tp",), ("cp",), ("pp",), ("dp",), ("cp", "dp"))]
