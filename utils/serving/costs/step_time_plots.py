"""Figures of the chapter "What an inference server optimises", drawn from :mod:`utils.serving.costs.step_time`.

Pure functions of their arguments that return a Matplotlib figure (the
:mod:`utils.viz` pattern), so a page can draw them statically and with sliders.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from utils.attention.kv_cache import MODELS
from utils.gpu import hardware
from utils.gpu.roofline import OpCost
from utils.serving.costs import step_time as st

PARETO_MODELS = {"LLaMA-2-7B": "tab:red", "Llama-3-8B": "tab:blue"}
"""The models :func:`plot_pareto` draws: multi-head attention against grouped-query attention, both ~7-8B."""


def plot_request_timeline(arrival: float, first_token: float, token_times: Sequence[float],
                          tpot_slo: float | None = None) -> Figure:
    """One request on a time axis: its wait and prefill (TTFT), each later token, the gaps (ITL) and E2E."""
    times = [first_token, *token_times]
    if not arrival <= first_token or any(b < a for a, b in zip(times, times[1:])):
        raise ValueError("times must satisfy arrival <= first_token <= token_times[0] <= ... (non-decreasing)")
    fig, ax = plt.subplots(figsize=(8.4, 2.1))
    ax.barh(1, first_token - arrival, left=arrival, height=0.35, color="tab:orange", alpha=0.6)
    ax.text(arrival, 1.3, "TTFT (queue + prefill)", ha="left", va="center", fontsize=8)
    ax.plot(times, [0.3] * len(times), "|", color="tab:blue", ms=14, mew=2)
    gaps = np.diff(times)
    for t0, gap in zip(times, gaps):
        late = tpot_slo is not None and gap > tpot_slo
        ax.annotate("", (t0 + gap, 0.05), (t0, 0.05),
                    arrowprops=dict(arrowstyle="<->", color="tab:red" if late else "0.4", lw=1))
    ax.text(times[0], -0.25, "ITL: the gaps between tokens (red: above the TPOT target)" if tpot_slo else
            "ITL: the gaps between tokens", fontsize=8, va="center")
    ax.annotate("", (times[-1], 1.55), (arrival, 1.55), arrowprops=dict(arrowstyle="<->", lw=1))
    tpot = (times[-1] - first_token) / (len(times) - 1) if len(times) > 1 else 0.0
    ax.text((arrival + times[-1]) / 2, 1.75, f"end-to-end latency = TTFT + TPOT x (O - 1); here TPOT = "
            f"{1e3 * tpot:.0f} ms over {len(times)} tokens", ha="center", fontsize=8)
    ax.set(xlabel="time (s)", yticks=[], ylim=(-0.5, 2.0), xlim=(arrival - 0.02 * times[-1], 1.02 * times[-1]))
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def plot_pareto(context: int = 1024, tpot_slo_ms: float = 20.0, gpu: str = "H100-SXM") -> Figure:
    """Decode throughput against time per output token as the batch grows, for MHA and GQA models.

    Each curve runs over batches 1, 2, 4, ... (:func:`utils.serving.costs.step_time.pareto`), solid while the
    caches fit beside the weights in ``gpu``'s memory, dotted beyond; the vertical line is the TPOT target,
    and the filled marker the largest batch that meets it (:func:`~utils.serving.costs.step_time.max_batch_at_tpot`).
    """
    roof, hbm = st.Roof.of(gpu, "bf16"), hardware.spec(gpu).hbm_bytes
    fig, ax = plt.subplots(figsize=(7.6, 4.2))
    batches = [2 ** i for i in range(0, 12)]
    for name, color in PARETO_MODELS.items():
        model = st.served_model(name)
        cap = st.max_batch(model, context, hbm)
        pts = st.pareto(model, roof, context, batches)
        t = np.array([p[1] for p in pts]) * 1e3
        r = np.array([p[2] for p in pts])
        fits = np.array([p[0] <= cap for p in pts])
        ax.loglog(t[fits], r[fits], "o-", color=color, ms=4, label=f"{name} ({MODELS[name].kind})")
        if (~fits).any():
            k = int(fits.sum())
            ax.loglog(t[max(k - 1, 0):], r[max(k - 1, 0):], "o:", color=color, ms=3, alpha=0.4)
        for b, tb, rb in pts:
            if b in (1, 16, 256) and b <= cap:
                ax.annotate(f"B={b}", (tb * 1e3, rb), fontsize=7, xytext=(4, -10), textcoords="offset points",
                            color=color)
        best = st.max_batch_at_tpot(model, roof, context, tpot_slo_ms / 1e3, hbm)
        if best:
            tb = st.decode_step_seconds(model, best, context, roof)
            ax.loglog(tb * 1e3, best / tb, "*", color=color, ms=13, mec="black",
                      label=f"  B={best}: {best / tb:,.0f} tokens/s at <= {tpot_slo_ms:g} ms")
    ax.axvline(tpot_slo_ms, color="0.4", ls="--", lw=1)
    ax.text(tpot_slo_ms * 1.04, ax.get_ylim()[0] * 1.3, "TPOT target", fontsize=8, color="0.3")
    ax.set(xlabel="time per output token (ms): latency", ylabel="decode tokens/s per GPU: throughput",
           title=f"Batch grows along each curve: {gpu}, bf16, {context}-token contexts (dotted: caches do not fit)")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_phase_roofline(batch: int = 64, context: int = 4096, prompt_len: int = 1024,
                        gpu: str = "H100-SXM") -> Figure:
    """Where each part of a step sits on ``gpu``'s bf16 roofline: prefill against decode, weights against caches.

    Weights: a prefill of ``prompt_len`` tokens and a decode step of ``batch`` sequences (Llama-3-8B's
    matmuls; the intensity is about the tokens in the step). Attention in decode over ``context`` tokens:
    MHA (LLaMA-2-7B), GQA (Llama-3-8B) and absorbed MLA (DeepSeek-V3), each independent of the batch.
    """
    roof = st.Roof.of(gpu, "bf16")
    fig, ax = plt.subplots(figsize=(7.6, 4.2))
    x = np.logspace(-0.5, 4, 200)
    ax.loglog(x, np.minimum(roof.peak_flops, x * roof.bandwidth) / 1e12, color="black", lw=1)
    ax.axvline(roof.ridge, color="0.6", ls=":", lw=1)
    ax.text(roof.ridge * 1.08, 2, f"ridge {roof.ridge:.0f}", fontsize=7, color="0.4")
    llama3 = st.served_model("Llama-3-8B")
    points = [
        (f"prefill weights, {prompt_len} tokens", st.step_cost(llama3, prefill_chunks=[(prompt_len, 0)]).linear,
         "tab:green", "s"),
        (f"prefill attention, {prompt_len} tokens (GQA)",
         st.step_cost(llama3, prefill_chunks=[(prompt_len, 0)]).attention, "tab:olive", "s"),
        (f"decode weights, batch {batch}", st.step_cost(llama3, [context] * batch).linear, "tab:purple", "o"),
        ("decode weights, batch 1", st.step_cost(llama3, [context]).linear, "tab:purple", "v"),
    ]
    for name, color in (("LLaMA-2-7B", "tab:red"), ("Llama-3-8B", "tab:blue"), ("DeepSeek-V3", "tab:cyan")):
        config = MODELS[name]
        flops = st.attention_flops_per_pair(config) * context
        points.append((f"decode attention, {config.kind} ({name})",
                       OpCost(flops, config.cache_bytes(context)), color, "D"))
    for label, cost, color, marker in points:
        ai = cost.intensity
        ax.loglog(ai, min(roof.peak_flops, ai * roof.bandwidth) / 1e12, marker, color=color, ms=8,
                  mec="black", label=f"{label}: {ai:,.0f} FLOPs/B")
    ax.set(xlabel="arithmetic intensity (FLOPs/byte)", ylabel="attainable TFLOP/s",
           title=f"Parts of a step on the {gpu} roofline (bf16, decode contexts of {context} tokens)")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig
