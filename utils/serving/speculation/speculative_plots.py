"""Figures of the speculative-decoding chapter and lab: expected speed-up, its roofline limit, the steps animated.

Pure functions of their parameters that return a Matplotlib figure (or, for the
animation, kernel-free HTML), for the static figure, ``viz.live`` and ``viz.explore``.
"""

from __future__ import annotations


import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from utils import viz
from utils.gpu import hardware
from utils.serving.speculation.speculative import (SpeculativeResult, expected_speedup, expected_tokens_per_step, optimal_k,
                                       roofline_speedup)
from utils.serving.costs.step_time import Roof, max_batch, served_model

__all__ = ["animate_steps", "plot_speedup", "plot_speedup_against_batch"]

ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)


def plot_speedup(alpha: float = 0.8, k: int = 4, c: float = 0.05) -> Figure:
    """Left: tokens per target pass ``(1 - a^(k+1)) / (1 - a)`` against ``k``. Right: Leviathan's expected
    speed-up ``/(k c + 1)`` against ``k`` for draft cost ``c``, the best ``k`` of each curve marked."""
    ks = np.arange(0, 13)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 3.4))
    for a in sorted(set(ALPHAS) | {alpha}):
        bold = a == alpha
        style = {"lw": 2.2 if bold else 1, "alpha": 1 if bold else 0.55, "label": f"alpha = {a:.2f}"}
        left.plot(ks, [expected_tokens_per_step(a, int(j)) for j in ks], **style)
        line, = right.plot(ks, [expected_speedup(a, int(j), c) for j in ks], **style)
        best = optimal_k(a, c, k_max=int(ks[-1]))
        right.plot(best, expected_speedup(a, best, c), "o", color=line.get_color(), ms=4)
    left.plot(k, expected_tokens_per_step(alpha, k), "ks", ms=6)
    left.annotate(f"{expected_tokens_per_step(alpha, k):.2f} tokens", (k, expected_tokens_per_step(alpha, k)),
                  xytext=(6, -12), textcoords="offset points", fontsize=8)
    right.plot(k, expected_speedup(alpha, k, c), "ks", ms=6)
    right.annotate(f"{expected_speedup(alpha, k, c):.2f}x", (k, expected_speedup(alpha, k, c)), xytext=(6, -12),
                   textcoords="offset points", fontsize=8)
    right.axhline(1, color="0.5", ls=":", lw=1)
    left.set(xlabel="draft tokens per step k", ylabel="tokens per target pass", title="what one pass yields")
    right.set(xlabel="draft tokens per step k", ylabel="expected speed-up",
              title=f"draft cost c = {c:g} (dots: the best k)")
    left.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_speedup_against_batch(model: str = "Llama-3-8B", alpha: float = 0.8, k: int = 4, c: float = 0.05,
                               context: int = 2048, gpu: str = "H100-SXM") -> Figure:
    """Expected speed-up against batch when the verify pass is priced on ``gpu``'s bf16 roofline with
    chapter 1's step model (:func:`utils.serving.speculation.speculative.roofline_speedup`: weight matmuls and attention
    as separate kernels), with no cache and with ``context`` tokens cached."""
    served, roof = served_model(model), Roof.of(gpu, "bf16")
    batches = np.unique(np.round(np.logspace(0, 10, 60, base=2)).astype(int))
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for ctx, color in ((0, "tab:blue"), (context, "tab:red")):
        ax.semilogx(batches, [roofline_speedup(alpha, k, c, served, int(b), ctx, roof) for b in batches],
                    color=color, label=f"context {ctx}" if ctx else "no cache (weights only)")
    ax.axhline(expected_speedup(alpha, k, c), color="0.4", ls="--", lw=1, label="verify pass free (Leviathan)")
    ax.axhline(1, color="0.5", ls=":", lw=1)
    ridge_batch = roof.ridge / (k + 1)  # B (k + 1) tokens at ~1 FLOP/byte each meet the ridge (bf16 weights)
    ax.axvline(ridge_batch, color="0.5", ls=":", lw=1)
    ax.text(ridge_batch, 0.15, f" weight matmuls\n compute-bound\n past B={ridge_batch:.0f}", fontsize=7, color="0.3")
    hbm = hardware.spec(gpu).hbm_bytes
    if context and served.resident_bytes >= hbm:  # e.g. a 70B model in bf16 on one 80 GB GPU
        ax.text(0.98, 0.97, f"the weights alone ({served.resident_bytes / 1e9:.0f} GB) exceed one {gpu}'s "
                f"{hbm / 1e9:.0f} GB:\nthis curve needs tensor parallelism (chapter 6)", transform=ax.transAxes,
                ha="right", va="top", fontsize=7, color="tab:red")
    elif context:
        cap = max_batch(served, context, hbm)
        ax.axvline(cap, color="tab:red", ls=":", lw=1)
        ax.text(cap, 0.15, f" memory full\n at B={cap}", fontsize=7, color="tab:red")
    ax.set(xlabel="batch (sequences)", ylabel="expected speed-up", ylim=(0, expected_speedup(alpha, k, c) * 1.15),
           title=f"{model} on {gpu}: alpha {alpha}, k {k}, c {c:g}")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def animate_steps(result: SpeculativeResult, prompt_len: int, max_steps: int = 12, interval_ms: int = 1200):
    """A scrubbable animation of speculative steps: committed tokens, drafts kept (green) or rejected (red,
    struck through), and each step's target token (blue), as kernel-free HTML with an ``alt`` text."""
    tokens = result.tokens[0].tolist()
    n_steps = min(max_steps, len(result.accepted))
    starts = [prompt_len]
    for a in result.accepted:
        starts.append(starts[-1] + a + 1)
    width = starts[n_steps] + max(result.drafted[:n_steps] or [0]) + 1

    def draw(ax, step: int) -> None:
        start, proposal, kept = starts[step], result.proposals[step], result.accepted[step]
        for i in range(start):
            ax.add_patch(Rectangle((i, 0), 0.9, 0.9, color="0.85" if i >= prompt_len else "0.7"))
            ax.text(i + 0.45, 0.45, str(tokens[i]), ha="center", va="center", fontsize=6)
        for j, t in enumerate(proposal):
            ok = j < kept
            ax.add_patch(Rectangle((start + j, 1.2), 0.9, 0.9, color="#9bd79b" if ok else "#f2a2a2"))
            ax.text(start + j + 0.45, 1.65, str(t), ha="center", va="center", fontsize=6)
            if not ok:
                ax.plot([start + j + 0.1, start + j + 0.8], [1.3, 2.0], color="firebrick", lw=1)
        target_token = tokens[start + kept]
        ax.add_patch(Rectangle((start + kept, 0), 0.9, 0.9, color="#9cc3e6"))
        ax.text(start + kept + 0.45, 0.45, str(target_token), ha="center", va="center", fontsize=6)
        for j in range(kept):
            ax.add_patch(Rectangle((start + j, 0), 0.9, 0.9, color="#9bd79b"))
            ax.text(start + j + 0.45, 0.45, str(tokens[start + j]), ha="center", va="center", fontsize=6)
        what = "bonus" if kept == len(proposal) else "corrected"
        ax.set_title(f"step {step + 1}: draft proposes {len(proposal)}, target keeps {kept} and adds a {what} "
                     f"token (blue): {kept + 1} tokens for one target pass", fontsize=8)
        ax.text(-0.3, 1.65, "draft", ha="right", va="center", fontsize=7)
        ax.text(-0.3, 0.45, "text", ha="right", va="center", fontsize=7)
        ax.set_xlim(-2.5, width + 0.5)
        ax.set_ylim(-0.2, 2.3)
        ax.axis("off")

    def alt(step: int) -> str:
        kept, proposed = result.accepted[step], len(result.proposals[step])
        return (f"Speculative decoding, step {step + 1} of {n_steps}: the draft proposes {proposed} tokens above the "
                f"text; the target keeps {kept} (green), rejects {proposed - kept} (red) and adds its own token "
                "(blue).")

    return viz.animate(draw, n_steps, figsize=(7.5, 1.6), interval_ms=interval_ms, dpi=72, alt=alt,
                       label="Speculative decoding: step")
