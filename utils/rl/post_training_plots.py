"""The figures of part 4's post-training chapters: the pipeline, LoRA, RLHF's memory, time and placement.

Pure functions of their parameters returning a Matplotlib figure (the book's
widget pattern, :mod:`utils.viz`); the numbers come from :mod:`utils.rl.lora`
and :mod:`utils.rl.rlhf_cost` and :mod:`utils.rl.rollout_systems`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from utils.gpu import hardware
from utils.parallel.memory import ADAM_MIXED_PRECISION_OPTIMIZER_BYTES, FP16_GRAD_BYTES, FP16_PARAM_BYTES
from utils.rl.lora import llama_linear_shapes, lora_param_count
from utils.rl.rlhf_cost import policy_model, rlhf_memory_bytes, rlhf_step_time
from utils.rl.rollout_systems import PLACEMENTS, placement_memory_bytes, steady_step_seconds, step_timeline

_GB = 1e9


def plot_pipeline() -> Figure:
    """Pretraining -> SFT -> reward model -> RL (PPO/GRPO), or -> DPO, with what each stage learns from."""
    fig, ax = plt.subplots(figsize=(8.0, 2.6))
    boxes = [(0.0, 0.55, "pretraining", "next token on\ntrillions of tokens"),
             (2.1, 0.55, "SFT", "(prompt, answer)\ndemonstrations"),
             (4.2, 1.05, "reward model", "(prompt, chosen,\nrejected) pairs"),
             (6.3, 1.05, "RL: PPO / GRPO", "prompts; samples\nscored by the RM"),
             (5.25, 0.0, "DPO", "the same pairs,\nno RM, no sampling")]
    for x, y, title, note in boxes:
        ax.add_patch(FancyBboxPatch((x, y), 1.7, 0.8, boxstyle="round,pad=0.03", fc="#dbe9f6", ec="#2b6cb0"))
        ax.text(x + 0.85, y + 0.58, title, ha="center", va="center", fontsize=9, weight="bold")
        ax.text(x + 0.85, y + 0.25, note, ha="center", va="center", fontsize=7.5)
    arrow = dict(arrowstyle="->", color="#444")
    for (x0, y0), (x1, y1) in [((1.7, 0.95), (2.1, 0.95)), ((3.8, 1.05), (4.2, 1.3)), ((5.9, 1.45), (6.3, 1.45)),
                               ((3.8, 0.85), (5.25, 0.45))]:
        ax.annotate("", (x1, y1), (x0, y0), arrowprops=arrow)
    ax.set_xlim(-0.1, 8.1)
    ax.set_ylim(-0.1, 1.95)
    ax.axis("off")
    ax.set_title("The post-training pipeline (InstructGPT's three steps after pretraining, and DPO's shortcut)",
                 fontsize=9)
    fig.tight_layout()
    return fig


def plot_singular_values(rank: int = 4, d: int = 64, seed: int = 0) -> Figure:
    """Singular values of a dense ``d x d`` update and of a rank-``rank`` update ``B A`` of the same norm."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(d, d, generator=g, dtype=torch.float64)
    low = torch.randn(d, rank, generator=g, dtype=torch.float64) @ torch.randn(rank, d, generator=g,
                                                                               dtype=torch.float64)
    low *= dense.norm() / low.norm()
    fig, ax = plt.subplots()
    idx = np.arange(1, d + 1)
    ax.semilogy(idx, torch.linalg.svdvals(dense).clamp_min(1e-16).numpy(), "o-", ms=3, label="dense update (full FT)")
    ax.semilogy(idx, torch.linalg.svdvals(low).clamp_min(1e-16).numpy(), "s-", ms=3,
                label=f"LoRA update B A, r = {rank}")
    ax.axvline(rank + 0.5, color="gray", ls=":")
    ax.set_xlabel("index of the singular value")
    ax.set_ylabel("singular value (log)")
    ax.set_title(f"A rank-{rank} update has {rank} nonzero singular values; the rest are rounding", fontsize=9)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_lora_memory(rank: int = 8, targets: tuple[str, ...] = ("q_proj", "v_proj"), model: str = "LLaMA-2-7B",
                     frozen_bytes: float = 2.0) -> Figure:
    """Model-state GB of full fine-tuning vs LoRA on one GPU, by kind: weights, gradients, Adam state."""
    m = policy_model(model)
    c = m.attention
    shapes = llama_linear_shapes(c.hidden, c.n_layers, m.intermediate, c.n_heads, c.n_kv_heads, tuple(targets))
    n_lora = lora_param_count(shapes, rank)
    n = m.n_params
    full = [FP16_PARAM_BYTES * n, FP16_GRAD_BYTES * n, ADAM_MIXED_PRECISION_OPTIMIZER_BYTES * n]
    lora = [frozen_bytes * n + FP16_PARAM_BYTES * n_lora, FP16_GRAD_BYTES * n_lora,
            ADAM_MIXED_PRECISION_OPTIMIZER_BYTES * n_lora]
    fig, ax = plt.subplots()
    bottoms = np.zeros(2)
    for i, (label, color) in enumerate([("weights", "#4c78a8"), ("gradients", "#f58518"),
                                        ("Adam state (fp32 master, m, v)", "#54a24b")]):
        values = np.array([full[i], lora[i]]) / _GB
        ax.bar(["full fine-tuning", f"LoRA r={rank}\n{'+'.join(t.split('_')[0] for t in targets)}"], values,
               bottom=bottoms, color=color, label=label)
        bottoms += values
    for x, total in enumerate(bottoms):
        ax.text(x, total, f"{total:.1f} GB", ha="center", va="bottom")
    ax.axhline(hardware.spec("H100-SXM").hbm_bytes / _GB, color="red", ls="--", lw=1, label="one H100 (80 GB)")
    ax.set_ylabel("model state on one GPU (GB)")
    ax.set_title(f"{model}: {n / 1e9:.2f}B parameters; LoRA trains {n_lora / 1e6:.2f}M ({100 * n_lora / n:.3f}%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_rlhf_memory(model: str = "LLaMA-2-7B", n_gpus: int = 8, stage: int = 3) -> Figure:
    """Model-state GB per GPU of PPO, GRPO and DPO, stacked by model (policy, reference, reward, value)."""
    n = policy_model(model).n_params
    algos = ("ppo", "grpo", "dpo")
    parts = {a: rlhf_memory_bytes(a, n, n_gpus, stage) for a in algos}
    fig, ax = plt.subplots()
    bottoms = np.zeros(len(algos))
    for key, color in [("policy", "#4c78a8"), ("value", "#e45756"), ("reference", "#72b7b2"), ("reward", "#eeca3b")]:
        values = np.array([parts[a][key] for a in algos]) / _GB
        ax.bar([a.upper() for a in algos], values, bottom=bottoms, color=color, label=key)
        bottoms += values
    for x, total in enumerate(bottoms):
        ax.text(x, total, f"{total:.0f} GB", ha="center", va="bottom")
    ax.axhline(hardware.spec("H100-SXM").hbm_bytes / _GB, color="red", ls="--", lw=1, label="one H100 (80 GB)")
    ax.set_ylabel("model state per GPU (GB)")
    ax.set_title(f"{model} ({n / 1e9:.0f}B), ZeRO stage {stage} over {n_gpus} GPUs; activations and KV cache extra",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_step_time(model: str = "LLaMA-2-7B", group_size: int = 8, response_len: int = 1024, prompt_len: int = 256,
                   n_gpus: int = 8, tp: int = 1, algorithm: str = "grpo", epochs: int = 1) -> Figure:
    """Seconds per prompt by phase (stacked) and generation's share of the step, against the prompts per step.

    ``epochs`` passes of training per step (PPO epochs, GRPO's mu); old log-probs and weight sync included.
    """
    m = policy_model(model)
    prompts = [1, 2, 4, 8, 16, 32, 64, 128]
    steps = [rlhf_step_time(algorithm, m, p, group_size, prompt_len, response_len, n_gpus, tp, epochs=epochs)
             for p in prompts]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9.0, 3.6))
    x = np.arange(len(prompts))
    bottom = np.zeros(len(prompts))
    for name, color in [("generation", "#e45756"), ("old_log_probs", "#b279a2"), ("scoring", "#72b7b2"),
                        ("training", "#4c78a8"), ("communication", "#9d755d"), ("weight_sync", "#bab0ac")]:
        values = np.array([getattr(s, name) / p for s, p in zip(steps, prompts)])
        ax.bar(x, values, bottom=bottom, color=color, label=name)
        bottom += values
    ax.set_xticks(x, [str(p) for p in prompts])
    ax.set_xlabel(f"prompts per step (x {group_size} samples each)")
    ax.set_ylabel("seconds per prompt (model)")
    ax.legend(fontsize=7)
    ax.set_title(f"{algorithm.upper()} step, {model}, {n_gpus} H100, tp={tp}, {epochs} epoch(s)", fontsize=9)
    ax2.plot(prompts, [100 * s.generation_share for s in steps], "o-", color="#e45756")
    ax2.set_xscale("log", base=2)
    ax2.set_ylim(0, 100)
    ax2.set_xlabel("prompts per step")
    ax2.set_ylabel("generation's share of the step (%)")
    ax2.set_title(f"prompt {prompt_len}, response {response_len} tokens", fontsize=9)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    return fig


_PHASE_COLORS = {"generation": "#e45756", "log-probs + scoring": "#72b7b2", "training": "#4c78a8",
                 "weight sync": "#333333"}


def plot_step_timeline(model: str = "LLaMA-2-7B", algorithm: str = "grpo", n_prompts: int = 16, group_size: int = 8,
                       response_len: int = 1024, prompt_len: int = 256, n_gpus: int = 8, n_rollout_gpus: int = 4,
                       tp: int = 1, epochs: int = 1, n_steps: int = 3) -> Figure:
    """Gantt chart of ``n_steps`` RL steps under each placement (colocated, disaggregated, async), one row per lane.

    Bars are :func:`utils.rl.rollout_systems.step_timeline` segments, labelled by step; each panel's title gives
    its steady-state seconds per step.
    """
    m = policy_model(model)
    fig, axes = plt.subplots(len(PLACEMENTS), 1, figsize=(9.0, 5.4), sharex=True)
    for ax, placement in zip(axes, PLACEMENTS):
        segs = step_timeline(placement, algorithm, m, n_prompts, group_size, prompt_len, response_len, n_gpus, tp,
                             n_rollout_gpus=None if placement == "colocated" else n_rollout_gpus, n_steps=n_steps,
                             epochs=epochs)
        lanes = list(dict.fromkeys(s.lane for s in segs))
        ax.barh([lanes.index(s.lane) for s in segs], [s.end - s.start for s in segs], left=[s.start for s in segs],
                height=0.6, color=[_PHASE_COLORS[s.phase] for s in segs], edgecolor="white")  # one call: cheaper
        for s in segs:
            if s.phase != "weight sync" and s.end - s.start > 0.04 * max(x.end for x in segs):
                ax.text((s.start + s.end) / 2, lanes.index(s.lane), str(s.step), ha="center", va="center",
                        color="white", fontsize=8)
        ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{placement}: {steady_step_seconds(segs):.1f} s per step", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=color) for color in _PHASE_COLORS.values()]
    fig.legend(handles, list(_PHASE_COLORS), fontsize=8, ncol=4, loc="upper center")
    axes[-1].set_xlabel(f"seconds ({algorithm.upper()}, {model}, {n_prompts} x {group_size} samples of "
                        f"{response_len} tokens, {n_gpus} H100, {epochs} epoch(s); numbers are steps)")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return fig


def plot_placement_memory(model: str = "LLaMA-2-70B", algorithm: str = "ppo", n_gpus: int = 64, tp: int = 4,
                          sequences: int = 128, context: int = 1280, n_rollout_gpus: int = 16) -> Figure:
    """GB per GPU, stacked by component, of each kind of GPU or phase under the three memory placements."""
    m = policy_model(model)
    cases = {"colocated": placement_memory_bytes(algorithm, m, n_gpus, tp, sequences, context),
             "colocated + sleep": placement_memory_bytes(algorithm, m, n_gpus, tp, sequences, context, sleep=True),
             "disaggregated": placement_memory_bytes(algorithm, m, n_gpus, tp, sequences, context, "disaggregated",
                                                     n_rollout_gpus=n_rollout_gpus)}
    bars = [(f"{case}\n{kind}", parts) for case, kinds in cases.items() for kind, parts in kinds.items()]
    colors = {"policy": "#4c78a8", "value": "#e45756", "reference": "#72b7b2", "reward": "#eeca3b",
              "generator weights": "#b279a2", "KV cache": "#ff9da6"}
    fig, ax = plt.subplots(figsize=(9.0, 3.8))
    bottoms = np.zeros(len(bars))
    for key, color in colors.items():
        values = np.array([parts.get(key, 0.0) for _, parts in bars]) / _GB
        ax.bar(range(len(bars)), values, bottom=bottoms, color=color, label=key)
        bottoms += values
    for x, total in enumerate(bottoms):
        ax.text(x, total, f"{total:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(bars)), [label for label, _ in bars], fontsize=7)
    ax.axhline(hardware.spec("H100-SXM").hbm_bytes / _GB, color="red", ls="--", lw=1, label="one H100 (80 GB)")
    ax.set_ylabel("GB per GPU")
    ax.set_title(f"{algorithm.upper()} on {model}, {n_gpus} GPUs, ZeRO-3, rollout tp={tp}, {sequences} sequences "
                 f"of {context} tokens", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
