"""Figures of continuous batching: which request ran what in each step of an engine.

Drawn from :attr:`utils.serving.runtime.engine.EngineStats.schedule`, the engine's own
record, so a figure shows what the code did, not a sketch of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from utils.serving.runtime.engine import StepRecord

__all__ = ["PHASE_COLORS", "draw_schedule", "interference_run", "plot_capacity", "plot_chunking_tradeoff", "plot_interference",
           "plot_schedule"]

PHASE_COLORS = {"prefill": "#e69f00", "decode": "#0072b2"}
"""Orange for prompt (or recomputed) tokens, blue for one decoded token."""


def draw_schedule(ax: Axes, schedule: Sequence[StepRecord], upto: int | None = None, budget: int | None = None,
                  title: str = "") -> None:
    """Steps across, requests down: a cell per chunk, orange (prefill, shaded by its share of ``budget``) or
    blue (decode); an ``x`` where a request was preempted. Only steps ``< upto`` are drawn (all by default)."""
    steps = schedule if upto is None else schedule[:upto]
    requests = sorted({rid for record in schedule for rid, _, _ in record.chunks})
    row = {rid: i for i, rid in enumerate(requests)}
    for step, record in enumerate(steps):
        for rid, n, phase in record.chunks:
            alpha = 1.0 if phase == "decode" or not budget else 0.35 + 0.65 * min(1.0, n / budget)
            ax.add_patch(plt.Rectangle((step, row[rid] - 0.4), 0.95, 0.8, color=PHASE_COLORS[phase], alpha=alpha,
                                       linewidth=0))
            if phase == "prefill" and len(schedule) <= 60:
                ax.text(step + 0.47, row[rid], str(n), ha="center", va="center", fontsize=6)
        for rid in record.preempted:
            ax.plot(step + 0.47, row[rid], marker="x", color="#d55e00", markersize=8, mew=2)
    ax.set_xlim(0, max(len(schedule), 1))
    ax.set_ylim(len(requests) - 0.5, -0.5)
    ax.set_yticks(range(len(requests)), [f"req {rid}" for rid in requests], fontsize=7)
    ax.set_xlabel("engine step")
    handles = [Patch(color=c, label=p) for p, c in PHASE_COLORS.items()]
    if any(record.preempted for record in schedule):
        handles.append(plt.Line2D([], [], marker="x", color="#d55e00", linestyle="", mew=2, label="preempted"))
    ax.legend(handles=handles, loc="upper right", fontsize=7, framealpha=0.9)
    if upto is not None and 0 < upto <= len(schedule):
        record = schedule[upto - 1]
        used = f"{record.num_tokens} tokens" + (f" of a budget of {budget}" if budget else "")
        ax.set_title(f"{title}step {upto - 1}: {len(record.chunks)} requests, {used}".strip(), fontsize=9)
    elif title:
        ax.set_title(title, fontsize=9)


def plot_schedule(schedule: Sequence[StepRecord], budget: int | None = None, title: str = "",
                  figsize: tuple[float, float] = (7.0, 3.2)) -> Figure:
    """The whole schedule of a run as one figure (see :func:`draw_schedule`)."""
    fig, ax = plt.subplots(figsize=figsize)
    draw_schedule(ax, schedule, budget=budget, title=title)
    fig.tight_layout()
    return fig


def interference_run(budget: int, n_decoding: int = 32, prompt_len: int = 8000, context: int = 1000,
                     model: str = "Llama-3-8B", gpu: str = "H100-SXM") -> tuple:
    """The chapter's scenario on the roofline clock (:func:`utils.serving.costs.simulate.simulate`).

    ``n_decoding`` requests with ``context``-token prompts are decoding (long outputs) when a
    ``prompt_len``-token prompt arrives, 10 ms after the last of them got its first token; a step budget of
    ``budget`` tokens (``budget >= prompt_len + n_decoding`` runs the prompt in one step). Returns
    ``(run, arrival, longest_gap)``: the run (the long prompt is its last request), the prompt's arrival, and
    the longest gap between two tokens of a decoding request that ends after the arrival.
    """
    from utils.serving.costs.simulate import simulate
    from utils.serving.costs.step_time import Roof, served_model
    from utils.serving.costs.trace import TimedRequest

    served, roof = served_model(model), Roof.of(gpu)
    budget = max(budget, n_decoding + 1)
    decoding = [TimedRequest(0.0, (1,) * context, 160) for _ in range(n_decoding)]
    blocks = (n_decoding * (context + 160) + prompt_len) // 16 + n_decoding + 2

    def run_of(trace):
        return simulate(trace, served, roof, num_blocks=blocks, block_size=16, max_num_batched_tokens=budget,
                        max_num_seqs=n_decoding + 1)

    arrival = max(r.token_times[0] for r in run_of(decoding).requests) + 0.010
    run = run_of(decoding + [TimedRequest(arrival, (2,) * prompt_len, 2)])
    gap = max(b - a for r in run.requests[:-1] for a, b in zip(r.token_times, r.token_times[1:]) if b > arrival)
    return run, arrival, gap


def plot_interference(token_budget: int = 512, n_decoding: int = 32, prompt_len: int = 8000) -> Figure:
    """Steps on the roofline clock (Llama-3-8B, H100 SXM) around the long prompt's arrival: each bar one step, its
    height the step's time, orange where it carried prompt tokens beyond the decodes."""
    run, arrival, gap = interference_run(token_budget, n_decoding, prompt_len)
    fig, ax = plt.subplots(figsize=(7.0, 3.0))
    start, window = 0.0, (arrival - 0.012, run.requests[-1].token_times[0] + 0.05)
    for record, dt in zip(run.schedule, run.step_seconds):
        if window[0] <= start <= window[1]:
            prompt = sum(n for _, n, phase in record.chunks if phase == "prefill")
            ax.bar((start - arrival) * 1e3, dt * 1e3, width=dt * 1e3, align="edge", edgecolor="white", linewidth=0.3,
                   color=PHASE_COLORS["prefill" if prompt else "decode"])
        start += dt
    ax.axvline(0, color="black", linewidth=0.8, linestyle=":")
    ax.set_xlabel("ms since the long prompt arrived (roofline bound)")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"budget {max(token_budget, n_decoding + 1)}: longest gap between tokens {gap * 1e3:.1f} ms, TTFT of the "
                 f"{prompt_len}-token prompt {run.requests[-1].ttft * 1e3:.0f} ms", fontsize=9)
    ax.legend(handles=[Patch(color=PHASE_COLORS["prefill"], label="step with a prompt chunk"),
                       Patch(color=PHASE_COLORS["decode"], label="decode-only step")], fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def plot_chunking_tradeoff(budgets: Sequence[int], longest_gap_ms: Sequence[float], ttft_ms: Sequence[float],
                           plain_step_ms: float) -> Figure:
    """The longest inter-token gap of the decoding requests and the long prompt's TTFT, against the step budget."""
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    ax.plot(budgets, longest_gap_ms, "o-", color=PHASE_COLORS["decode"], label="longest gap between tokens")
    ax.plot(budgets, ttft_ms, "s-", color=PHASE_COLORS["prefill"], label="TTFT of the long prompt")
    ax.axhline(plain_step_ms, color="gray", linestyle=":", label="a decode-only step")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("token budget per step")
    ax.set_ylabel("ms (roofline bound)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_capacity(rates: Sequence[float], curves: dict[str, dict[str, Sequence[float]]]) -> Figure:
    """Mean TTFT, the 99th percentile of inter-token gaps and the SLO attainment against the request rate, one
    line per policy; ``curves[policy][panel title]`` holds one value per rate."""
    fig, axes = plt.subplots(1, 3, figsize=(9.0, 2.8))
    styles = {"static": ("s--", "#999999"), "continuous": ("o-", PHASE_COLORS["decode"]),
              "continuous, chunked": ("^-", PHASE_COLORS["prefill"])}
    for name, curve in curves.items():
        marker, color = styles.get(name, ("d-", "black"))
        for ax, key in zip(axes, ("mean TTFT (s)", "p99 gap between tokens (ms)", "SLO attainment")):
            ax.plot(rates, curve[key], marker, color=color, label=name, markersize=4)
            ax.set_title(key, fontsize=9)
            ax.set_xlabel("requests per second")
    axes[0].set_yscale("log")
    axes[2].axhline(0.9, linestyle=":", color="gray", label="90 % goal")
    axes[2].set_ylim(0, 1.05)
    axes[2].legend(fontsize=6)
    fig.tight_layout()
    return fig
