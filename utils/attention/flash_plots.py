"""Figures of the FlashAttention chapter (``chapters/03-attention/05-flash-attention``): pure plot functions.

Each function draws from the numbers of :mod:`utils.attention.flash_reference`
and :mod:`utils.gpu.roofline` and returns a Matplotlib figure (or draws one
animation frame on a given axes, for :func:`utils.viz.animate`):

- :func:`draw_online_softmax_step`: one step of the online softmax of
  Milakov & Gimelshein 2018 (arXiv:1805.02867): running max ``m``, running
  denominator ``l`` and the rescaling factor ``exp(m_old - m_new)``;
- :func:`draw_tiling_step`: the loop order of FlashAttention-2 (Dao 2023,
  arXiv:2307.08691, Algorithm 1): a tile of query rows walking over the K/V tiles;
- :func:`plot_hbm_bytes`: HBM bytes of standard attention against
  FlashAttention (Dao et al. 2022, arXiv:2205.14135, section 3.2) over N;
- :func:`plot_attention_roofline`: both paths placed on a GPU's roofline, with
  and without L2 reuse of K and V, beside measured rates.
"""

from __future__ import annotations

import math
from typing import Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from utils.attention.flash_reference import attention_hbm_bytes, online_softmax_steps
from utils.gpu import hardware, roofline
from utils.validate import check_positive_int

WORKED_EXAMPLE = ((1.0, 2.0), (3.0, 4.0))
"""The chapter's worked example: a row seen as two blocks, x1 = [1, 2] and x2 = [3, 4]."""


def online_softmax_frames(blocks: Sequence[Sequence[float]] = WORKED_EXAMPLE) -> int:
    """Frames of :func:`draw_online_softmax_step` for ``blocks``: the empty state, one per block, the final divide."""
    return len(online_softmax_steps([list(b) for b in blocks])) + 2


def draw_online_softmax_step(ax: Axes, step: int, blocks: Sequence[Sequence[float]] = WORKED_EXAMPLE) -> None:
    """Frame ``step`` of the online softmax over ``blocks`` (one row seen block by block).

    Frame 0 is the empty state (m = -inf, l = 0); frame b (1-based) has seen
    blocks 1..b, showing ``exp(x - m)`` for every entry seen and the rescaling
    factor ``exp(m_old - m_new)`` applied to the old ``l``; the last frame divides
    by ``l`` and compares with the softmax of the whole row.
    """
    blocks = [list(map(float, b)) for b in blocks]
    states = online_softmax_steps(blocks)
    n_frames = len(states) + 2
    if not isinstance(step, int) or not 0 <= step < n_frames:
        raise ValueError(f"step must be an integer in [0, {n_frames - 1}] for {len(blocks)} blocks, got {step!r}")
    row = [x for b in blocks for x in b]
    owner = [i for i, b in enumerate(blocks) for _ in b]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ax.set_xlim(-0.6, len(row) - 0.4)
    ax.set_ylim(0, 1.32)
    ax.set_xticks(range(len(row)), [f"x={x:g}\n(block {owner[i] + 1})" for i, x in enumerate(row)], fontsize=8)
    ax.set_ylabel("exp(x - m), or softmax", fontsize=8)
    if step == 0:
        ax.set_title("start: m = -inf, l = 0 (nothing seen)", fontsize=9)
        return
    final = step == n_frames - 1
    state = states[-1] if final else states[step - 1]
    seen = len(state.probabilities)
    heights = state.probabilities if final else [p * state.l for p in state.probabilities]
    ax.bar(range(seen), heights, color=[colors[owner[i] % len(colors)] for i in range(seen)])
    if not final and step > 1:  # the old entries before rescaling, as outlines: they shrink by exp(m_old - m_new)
        previous = states[step - 2]
        ax.plot(range(len(previous.probabilities)), [p * previous.l for p in previous.probabilities], "k_",
                markersize=22, mew=1.5, ls="none", label="before rescaling")
        ax.legend(fontsize=8, loc="upper left")
    if final:
        m = max(row)
        exact = [math.exp(x - m) for x in row]
        exact = [e / sum(exact) for e in exact]
        ax.plot(range(len(row)), exact, "k_", markersize=22, mew=2, label="softmax of the whole row")
        ax.legend(fontsize=8, loc="upper left")
        ax.set_title(f"divide by l = {state.l:.4f} once at the end: the softmax of all {len(row)} entries",
                     fontsize=9)
        return
    m_old = -math.inf if step == 1 else states[step - 2].m
    l_old = 0.0 if step == 1 else states[step - 2].l
    alpha = math.exp(m_old - state.m)
    ax.set_title(f"after block {step}: m = {state.m:g}, l = {alpha:.4f} x {l_old:.4f} + "
                 f"{state.l - alpha * l_old:.4f} = {state.l:.4f}", fontsize=9)
    ax.text(0.99, 0.97, f"rescaling factor exp(m_old - m_new) = exp({m_old:g} - {state.m:g}) = {alpha:.4f}",
            transform=ax.transAxes, ha="right", va="top", fontsize=8)


def draw_tiling_step(ax: Axes, step: int, n_q_tiles: int = 4, n_k_tiles: int = 4, causal: bool = False) -> None:
    """Frame ``step`` of the loop order of FlashAttention-2's forward over the S = Q K^T grid.

    The outer loop (one program per tile of query rows) holds ``Q_i`` and its
    running ``m, l, O`` on chip; the inner loop streams ``K_j, V_j``. Frames run
    over the (i, j) pairs visited, row tile after row tile; with ``causal`` the
    tiles right of the diagonal are skipped. S is never written to HBM: the
    shaded tiles only ever existed on chip, one at a time.
    """
    check_positive_int("n_q_tiles", n_q_tiles)
    check_positive_int("n_k_tiles", n_k_tiles)
    visits = [(i, j) for i in range(n_q_tiles) for j in range(n_k_tiles) if not causal or j <= i]
    if not isinstance(step, int) or not 0 <= step < len(visits):
        raise ValueError(f"step must be an integer in [0, {len(visits) - 1}], got {step!r}")
    i_now, j_now = visits[step]
    ax.set_xlim(-1.4, n_k_tiles + 0.1)
    ax.set_ylim(n_q_tiles + 1.5, -0.1)
    ax.set_aspect("equal")
    ax.axis("off")
    for j in range(n_k_tiles):  # K_j^T / V_j tiles along the top
        ax.add_patch(Rectangle((j + 0.05, n_q_tiles + 0.35), 0.9, 0.9, fc="tab:orange" if j == j_now else "0.9"))
        ax.text(j + 0.5, n_q_tiles + 0.8, f"K{j},V{j}", ha="center", va="center", fontsize=7)
    for i in range(n_q_tiles):
        ax.add_patch(Rectangle((-1.3, i + 0.05), 0.9, 0.9, fc="tab:blue" if i == i_now else "0.9"))
        ax.text(-0.85, i + 0.5, f"Q{i}", ha="center", va="center", fontsize=7,
                color="w" if i == i_now else "k")
        for j in range(n_k_tiles):
            done = visits.index((i, j)) < step if (i, j) in visits else None
            face = "w" if done is None else ("tab:green" if (i, j) == (i_now, j_now) else "0.75" if done else "w")
            ax.add_patch(Rectangle((j + 0.05, i + 0.05), 0.9, 0.9, fc=face, ec="0.5",
                                   hatch="//" if done is None else None))
    ax.set_title(f"program {i_now} holds Q{i_now}, m, l, O on chip; loads K{j_now}, V{j_now} "
                 f"(step {step + 1} of {len(visits)})", fontsize=8)


def plot_hbm_bytes(head_dims: Sequence[int] = (64, 128), block_rows: int = 128, element_size: int = 2,
                   max_log2_seq: int = 16) -> Figure:
    """HBM bytes of one head's forward, standard vs FlashAttention, for N = 2^7 .. 2^max_log2_seq (log-log).

    Counts from :func:`utils.attention.flash_reference.attention_hbm_bytes`:
    ``(4Nd + 4N^2) b`` against ``(2Nd + 2 ceil(N/B_r) N d) b + 4N`` (K and V
    re-read from HBM per row tile) and ``4Nd b + 4N`` (re-reads hit L2); the
    ratio panel is standard over the re-read count.
    """
    check_positive_int("block_rows", block_rows)
    check_positive_int("max_log2_seq", max_log2_seq)
    if max_log2_seq < 8 or max_log2_seq > 20:
        raise ValueError(f"max_log2_seq must be in [8, 20], got {max_log2_seq}")
    seqs = [2 ** e for e in range(7, max_log2_seq + 1)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(8.4, 3.4))
    for idx, d in enumerate(head_dims):
        counts = [attention_hbm_bytes(n, d, element_size, block_rows) for n in seqs]
        color = f"C{idx}"
        left.loglog(seqs, [s for s, _ in counts], "-", color=color, label=f"standard, d={d}")
        left.loglog(seqs, [f for _, f in counts], "--", color=color, label=f"Flash, K/V re-read, d={d}")
        left.loglog(seqs, [attention_hbm_bytes(n, d, element_size, block_rows, kv_reuse="l2")[1] for n in seqs],
                    ":", color=color, label=f"Flash, re-reads hit L2, d={d}")
        right.semilogx(seqs, [s / f for s, f in counts], "o-", color=color, ms=3, label=f"d={d}")
    left.set_xlabel("sequence length N")
    left.set_ylabel("HBM bytes, one head, forward")
    left.legend(fontsize=7)
    right.set_xlabel("sequence length N")
    right.set_ylabel("standard / FlashAttention")
    right.set_title(f"B_r = {block_rows} query rows per tile, {8 * element_size}-bit", fontsize=9)
    right.legend(fontsize=7)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
    fig.tight_layout()
    return fig


def plot_attention_roofline(seq_len: int = 4096, head_dim: int = 128, gpu: str = "H100-SXM",
                            precision: str = "bf16", block_rows: int = 128,
                            measured: dict[str, float] | None = None,
                            exp_per_s: float | None = None, matmul_flops: float | None = None) -> Figure:
    """Standard attention and FlashAttention (one head's forward) placed on ``gpu``'s HBM roofline.

    Intensities from :func:`utils.gpu.roofline.attention_intensity`, FLOPs
    ``4 N^2 d`` over the HBM bytes of each model (2-byte elements): standard;
    FlashAttention with K and V re-read from HBM per ``block_rows`` query rows
    (the paper's count); and with the re-reads served by L2 (K and V once).
    ``measured`` maps a label to a measured rate in TFLOP/s, drawn at the L2
    model's intensity (where the recording places it); ``exp_per_s`` adds the
    ceiling of a kernel whose exponentials never overlap its matmuls
    (:func:`utils.gpu.roofline.attention_serial_exp_bound`), with matmuls at
    ``matmul_flops`` (the chip's peak by default; a measured cuBLAS rate is the honest choice).
    """
    check_positive_int("block_rows", block_rows)
    spec = hardware.spec(gpu)
    peak = spec.flops(precision)
    points = {"standard": roofline.attention_intensity(seq_len, head_dim, 2, fused=False),
              f"Flash, K/V re-read from HBM (B_r={block_rows})": roofline.attention_intensity(
                  seq_len, head_dim, 2, fused=True, block_rows=block_rows),
              "Flash, re-reads hit L2 (K/V once)": roofline.attention_intensity(
                  seq_len, head_dim, 2, fused=True, block_rows=block_rows, kv_reuse="l2")}
    xs = [2 ** (e / 4) for e in range(4 * 3, 4 * 14)]
    fig, ax = plt.subplots(figsize=(9.0, 3.6))
    ax.loglog(xs, [hardware.attainable_flops(x, peak, spec.hbm_bandwidth) / 1e12 for x in xs], "k-", lw=1.5)
    ridge = roofline.ridge_point(gpu, precision)
    ax.axvline(ridge, color="0.6", ls=":", lw=1)
    ax.text(ridge * 1.1, peak / 1e12 * 0.03, f"ridge {ridge:.0f} FLOP/B", fontsize=8, color="0.4")
    for idx, (label, x) in enumerate(points.items()):
        y = hardware.attainable_flops(x, peak, spec.hbm_bandwidth) / 1e12
        style = dict(mfc="none", mew=2, ms=11) if idx == 0 else dict(ms=7)  # hollow: it may coincide with a tiled point
        ax.plot([x], [y], "o", color=f"C{idx}", **style, label=f"{label}: {x:.0f} FLOP/B, at most {y:.0f} TFLOP/s")
    if exp_per_s is not None:
        serial = roofline.attention_serial_exp_bound(head_dim, matmul_flops or peak, exp_per_s) / 1e12
        ax.axhline(serial, color="C3", ls="--", lw=1,
                   label=f"exponentials not overlapped (d={head_dim}): {serial:.0f} TFLOP/s")
    x_l2 = points["Flash, re-reads hit L2 (K/V once)"]
    for idx, (label, rate) in enumerate((measured or {}).items()):
        ax.plot([x_l2 * 1.15 ** (idx + 1)], [rate], marker="^vsDP*xh"[idx % 8], color=f"C{idx + 4}", ms=7,
                ls="none", label=f"measured: {label}, {rate:.0f} TFLOP/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("arithmetic intensity (FLOPs per HBM byte)")
    ax.set_ylabel(f"attainable TFLOP/s ({precision})")
    ax.set_title(f"{gpu}: one head, N={seq_len}, d={head_dim}", fontsize=9)
    ax.legend(fontsize=6.5, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig
