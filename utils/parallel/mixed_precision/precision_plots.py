"""Pure plot functions of the mixed-precision pages: bit layouts, ranges, gradient histograms, loss curves.

Each returns a Matplotlib figure and reads only its arguments and
:mod:`utils.parallel.mixed_precision.precision` (the widget pattern of :mod:`utils.viz`).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from utils.parallel.mixed_precision.precision import FORMATS, float_bits, get_format

_COLORS = {"sign": "#d62728", "exponent": "#2ca02c", "mantissa": "#1f77b4"}
ORDER = ("fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2")


def plot_bit_layouts(value: float = -3.14159, formats: Sequence[str] = ORDER) -> Figure:
    """One row per format: sign, exponent and mantissa bits of ``value`` as stored, and the value it becomes."""
    for name in formats:
        get_format(name)
    fig, ax = plt.subplots(figsize=(9.0, 0.55 * len(formats) + 0.9))
    for row, name in enumerate(formats):
        f, y = FORMATS[name], len(formats) - 1 - row
        bits = float_bits(value, name)
        fields = [("sign", str(bits.sign))] + [("exponent", b) for b in bits.exponent] + \
                 [("mantissa", b) for b in bits.mantissa]
        for i, (kind, bit) in enumerate(fields):
            ax.add_patch(plt.Rectangle((i, y + 0.1), 0.95, 0.8, color=_COLORS[kind], alpha=0.75))
            ax.text(i + 0.47, y + 0.5, bit, ha="center", va="center", fontsize=7, color="white")
        ax.text(-0.5, y + 0.5, f"{name}\n1+{f.exponent_bits}+{f.mantissa_bits}", ha="right", va="center", fontsize=8)
        ax.text(len(fields) + 0.5, y + 0.5, f"= {bits.value:.7g}", ha="left", va="center", fontsize=8)
    for kind, color in _COLORS.items():
        ax.bar(0, 0, color=color, label=kind)
    ax.set_xlim(-4, 41)
    ax.set_ylim(0, len(formats))
    ax.axis("off")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8, frameon=False)
    ax.set_title(f"{value!r} as stored in each format", fontsize=9)
    fig.tight_layout()
    return fig


def plot_format_ranges(formats: Sequence[str] = ORDER, mark: float | None = None) -> Figure:
    """Log2 number line per format: subnormals (light), normals (dark) up to the largest finite; eps as text."""
    for name in formats:
        get_format(name)
    fig, ax = plt.subplots(figsize=(8.4, 0.45 * len(formats) + 1.0))
    for row, name in enumerate(formats):
        f, y = FORMATS[name], len(formats) - 1 - row
        lo, mid, hi = math.log2(f.smallest_subnormal), math.log2(f.smallest_normal), math.log2(f.max)
        ax.barh(y, mid - lo, left=lo, color="tab:blue", alpha=0.3, height=0.6)
        ax.barh(y, hi - mid, left=mid, color="tab:blue", alpha=0.85, height=0.6)
        ax.text(hi + 2, y, f"max {f.max:.3g}, eps $2^{{-{f.mantissa_bits}}}$", va="center", fontsize=7)
    if mark is not None and mark > 0:
        ax.axvline(math.log2(mark), color="tab:red", ls="--", lw=1)
        ax.text(math.log2(mark), len(formats) - 0.4, f" {mark:.3g}", color="tab:red", fontsize=8)
    ax.set_yticks(range(len(formats)), list(reversed(formats)))
    ax.set_xlabel("$\\log_2 |x|$ (light: subnormal, dark: normal)")
    ax.set_xlim(-155, 175)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_gradient_histogram(magnitudes: np.ndarray, loss_scale: float = 1.0, fmt: str = "fp16",
                            title: str = "gradient magnitudes") -> Figure:
    """Histogram of ``log2(|g| * loss_scale)`` (zeros left out) against ``fmt``'s subnormal, normal and max.

    The shaded left region rounds to zero in ``fmt``; the title gives that
    fraction and the fraction that would overflow (Micikevicius et al. 2018, Figure 3 style).
    """
    f = get_format(fmt)
    mags = np.abs(np.asarray(magnitudes, dtype=np.float64).ravel())
    mags = mags[mags > 0] * float(loss_scale)
    if mags.size == 0:
        raise ValueError("magnitudes has no nonzero value to draw")
    logs = np.log2(mags)
    under = float(np.mean(mags < f.smallest_subnormal / 2))
    over = float(np.mean(mags > f.max))
    fig, ax = plt.subplots(figsize=(7.2, 3.2))
    lo = min(logs.min(), math.log2(f.smallest_subnormal)) - 2
    hi = max(logs.max(), math.log2(f.max)) + 2
    ax.hist(logs, bins=np.arange(math.floor(lo), math.ceil(hi) + 1), color="tab:gray")
    ax.axvspan(lo, math.log2(f.smallest_subnormal / 2), color="tab:red", alpha=0.15, label=f"becomes 0 in {fmt}")
    ax.axvspan(math.log2(f.smallest_subnormal / 2), math.log2(f.smallest_normal), color="tab:orange", alpha=0.15,
               label=f"{fmt} subnormal (fewer bits)")
    ax.axvline(math.log2(f.max), color="tab:purple", ls="--", lw=1, label=f"{fmt} max {f.max:.3g}")
    ax.set_xlim(lo, hi)
    ax.set_xlabel(f"$\\log_2(|g| \\times {loss_scale:g})$")
    ax.set_ylabel("count")
    ax.set_title(f"{title}: {100 * under:.1f}% underflow, {100 * over:.2f}% overflow", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def plot_loss_curves(runs: Mapping[str, Sequence[float]], title: str = "training loss",
                     reference: str | None = None) -> Figure:
    """Loss against step for each named run, log scale; with ``reference`` (a key of ``runs``), a second
    panel shows each run's loss divided by the reference run's, step by step."""
    if not runs:
        raise ValueError("runs must name at least one loss curve")
    if reference is not None and reference not in runs:
        raise ValueError(f"reference must be one of {tuple(runs)}, got {reference!r}")
    fig, axes = plt.subplots(1, 2 if reference else 1, figsize=(9.6 if reference else 6.8, 3.4), squeeze=False)
    styles = ["-", "--", ":", "-.", "-"]
    for i, (name, losses) in enumerate(runs.items()):
        axes[0, 0].semilogy(np.arange(len(losses)), losses, ls=styles[i % len(styles)], label=name, lw=1.5)
        if reference:
            ratio = np.asarray(losses, dtype=float) / np.asarray(runs[reference], dtype=float)
            axes[0, 1].plot(np.arange(len(losses)), ratio, ls=styles[i % len(styles)], lw=1.5)
    axes[0, 0].set(xlabel="step", ylabel="loss")
    axes[0, 0].set_title(title, fontsize=9)
    axes[0, 0].legend(fontsize=8)
    if reference:
        axes[0, 1].set(xlabel="step", ylabel=f"loss / loss of {reference}")
        axes[0, 1].set_title(f"relative to {reference}", fontsize=9)
    for ax in axes[0]:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_scale_history(scales: Sequence[float], skipped: Sequence[bool], title: str = "dynamic loss scale") -> Figure:
    """The loss scale at each step (log2), with the skipped steps (inf/NaN found) marked."""
    if len(scales) != len(skipped) or not len(scales):
        raise ValueError(f"scales and skipped must be non-empty and of equal length, got {len(scales)} and "
                         f"{len(skipped)}")
    steps = np.arange(len(scales))
    fig, ax = plt.subplots(figsize=(6.8, 3.0))
    ax.step(steps, np.log2(np.asarray(scales, dtype=float)), where="post", color="tab:blue", label="scale")
    bad = np.asarray(skipped, dtype=bool)
    ax.plot(steps[bad], np.log2(np.asarray(scales, dtype=float))[bad], "x", color="tab:red",
            label=f"skipped step ({int(bad.sum())})")
    ax.set_xlabel("step")
    ax.set_ylabel("$\\log_2$ scale")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
