"""Figures of capstone 2: accuracy and importance ratios of the recorded GRPO runs, and the step's schedule.

The recorded runs are ``benchmarks/results/grpo_engine.json`` (:mod:`benchmarks.grpo_engine`). The schedule
(:func:`schedule`) is the one :mod:`utils.capstone.async_rl` runs, drawn from four phase durations: the
engine generates, the trainer computes log-probs and trains, then both take part in the weight broadcast.
Synchronously a step is the sum of the four; one step asynchronously, the engine generates the next batch
while the trainer trains, and a step is ``max(generation, log-probs + training) + sync``.
"""

from __future__ import annotations

import statistics

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from utils.validate import check_nonnegative, check_positive_int

MODES = ("sync", "async")
COLOURS = {"generate": "tab:orange", "log-probs": "tab:cyan", "train": "tab:blue", "sync": "tab:red"}


def _runs(record: dict, off_policy: bool) -> list[dict]:
    runs = [r for r in record["runs"] if r["off_policy"] == off_policy]
    if not runs:
        raise ValueError(f"the record has no {'off-policy' if off_policy else 'on-policy'} runs")
    return runs


def mean_accuracy(record: dict, off_policy: bool) -> list[float]:
    """The mean over seeds of the accuracy at each evaluation step."""
    return [statistics.mean(a) for a in zip(*(r["accuracy"] for r in _runs(record, off_policy)))]


def plot_accuracy(record: dict) -> Figure:
    """Accuracy against steps, each seed thin and the mean over seeds thick, on-policy and one step off."""
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for off, colour, label in ((False, "tab:blue", "on-policy"), (True, "tab:orange", "one step off-policy")):
        runs = _runs(record, off)
        for r in runs:
            ax.plot(r["eval_step"], r["accuracy"], color=colour, lw=0.8, alpha=0.45)
        ax.plot(runs[0]["eval_step"], mean_accuracy(record, off), color=colour, lw=2.5,
                label=f"{label}, mean of {len(runs)} seeds")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("accuracy (100 problems, T = 1)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("GRPO with the book's engine: each seed thin, the mean thick")
    fig.tight_layout()
    return fig


def plot_ratios(record: dict, cap: float = 2.0) -> Figure:
    """The largest importance ratio ``pi_old / mu`` of each off-policy batch, per seed, against the cap."""
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    for r in _runs(record, True):
        ax.plot(range(1, len(r["ratio_max"])), r["ratio_max"][1:], lw=1, label=f"seed {r['seed']}")
    ax.axhline(cap, color="k", ls="--", lw=1, label=f"cap C = {cap:g}")
    ax.set_yscale("log")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("largest ratio in the batch")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, ncol=2)
    ax.set_title("one step off-policy: the stale samples' importance ratios before truncation")
    fig.tight_layout()
    return fig


def schedule(generation: float, log_probs: float, training: float, sync: float, mode: str,
             steps: int = 3) -> list[tuple[str, str, float, float]]:
    """``[(lane, phase, start, end)]`` of ``steps`` steps on the ``"engine"`` and ``"trainer"`` lanes.

    ``sync``: the engine generates batch ``t``, the trainer computes its log-probs and trains, both broadcast the
    weights, then the engine generates batch ``t + 1``. ``async``: after batch ``t`` is sent the engine generates
    batch ``t + 1`` with the weights it holds, while the trainer works on batch ``t``; the broadcast starts when
    both are done. Step ``t``'s broadcast ends the step.
    """
    for name, value in (("generation", generation), ("log_probs", log_probs), ("training", training),
                        ("sync", sync)):
        check_nonnegative(name, value)
    check_positive_int("steps", steps)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    bars = [("engine", "generate", 0.0, generation)]
    batch_ready = generation  # when the batch the trainer needs next has been generated
    for _ in range(steps):
        t = batch_ready
        trainer_done = t + log_probs + training
        bars += [("trainer", "log-probs", t, t + log_probs), ("trainer", "train", t + log_probs, trainer_done)]
        engine_done = t
        if mode == "async":
            bars.append(("engine", "generate", t, t + generation))
            engine_done = t + generation
        start = max(trainer_done, engine_done)
        bars += [("trainer", "sync", start, start + sync), ("engine", "sync", start, start + sync)]
        if mode == "sync":
            bars.append(("engine", "generate", start + sync, start + sync + generation))
            batch_ready = start + sync + generation
        else:
            batch_ready = start + sync
    return bars


def step_seconds(generation: float, log_probs: float, training: float, sync: float, mode: str) -> float:
    """Seconds per step once the schedule is running: the sum, or ``max(generation, log-probs + training) + sync``."""
    a = schedule(generation, log_probs, training, sync, mode, steps=3)
    ends = [end for lane, phase, _, end in a if lane == "trainer" and phase == "sync"]
    return ends[2] - ends[1]


def plot_schedule(generation: float = 0.15, log_probs: float = 0.03, training: float = 0.09,
                  sync: float = 0.013, steps: int = 3) -> Figure:
    """The two schedules of ``steps`` steps on one time axis: the engine's and the trainer's lanes, each phase a bar."""
    fig, axes = plt.subplots(2, 1, figsize=(7.2, 3.5), sharex=True)
    for ax, mode in zip(axes, MODES):
        bars = schedule(generation, log_probs, training, sync, mode, steps)
        for lane, phase, start, end in bars:
            ax.barh(0 if lane == "trainer" else 1, end - start, left=start, height=0.6, color=COLOURS[phase],
                    edgecolor="white", lw=0.5)
        per_step = step_seconds(generation, log_probs, training, sync, mode)
        ax.set_yticks([0, 1], ["trainer", "engine"])
        ax.set_title(f"{'synchronous' if mode == 'sync' else 'one step asynchronous'}: "
                     f"{per_step * 1e3:.0f} ms per step", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    fig.legend(handles, list(COLOURS), ncol=4, fontsize=8, loc="upper center", frameon=False)
    axes[1].set_xlabel("seconds")
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig
