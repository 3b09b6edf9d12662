"""Capstone 2's recorded runs: GRPO with the serving engine's rollouts, on-policy against one step off-policy.

For each seed, :func:`utils.capstone.grpo_engine.train` runs both ways from the same pre-trained
model, and records the accuracy on all 100 problems (temperature 1, ``EVAL_SAMPLES`` samples each)
every ``eval_every`` steps, with the importance ratios of the off-policy batches. Then
:func:`utils.capstone.async_rl.run` trains on two processes (a trainer rank and an engine rank over
gloo), synchronously and one step asynchronously, and records each phase's seconds, the step time
and the bytes of each weight sync: how much of generation the asynchronous schedule hides.

    OMP_NUM_THREADS=1 python -m benchmarks.grpo_engine           # a few minutes on one core
    OMP_NUM_THREADS=1 python -m benchmarks.grpo_engine --quick   # seconds: a smoke test

Writes ``benchmarks/results/grpo_engine.json`` (``--quick``: ``grpo_engine-quick.json``, or ``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Sequence

import torch

from utils.capstone import async_rl
from utils.capstone.grpo_engine import EVAL_SAMPLES, Settings, train

RESULTS = Path(__file__).resolve().parent / "results"
FULL = {"seeds": [0, 1, 2], "steps": 60, "eval_every": 10, "async_steps": 20}
QUICK = {"seeds": [0], "steps": 2, "eval_every": 2, "async_steps": 2}


def run(settings: dict, log=print) -> dict:
    """Every seed both ways, then the two-process timings; with the run's metadata."""
    start = time.perf_counter()
    record: dict = {"runs": [], "async": {}}
    for seed in settings["seeds"]:
        for off_policy in (False, True):
            t0 = time.perf_counter()
            _, h = train(seed, off_policy, Settings(steps=settings["steps"], eval_every=settings["eval_every"]))
            record["runs"].append({
                "seed": seed, "off_policy": off_policy, "eval_step": h.eval_step, "accuracy": h.accuracy,
                "reward": h.reward, "ratio_mean": h.ratio_mean, "ratio_max": h.ratio_max,
                "truncated": h.truncated, "hit_rate": h.hit_rate, "sync_bytes": h.sync_bytes[0],
                "seconds": round(time.perf_counter() - t0, 2)})
            log(f"seed {seed} {'one step off' if off_policy else 'on-policy   '}: accuracy "
                + " ".join(f"{a:.3f}" for a in h.accuracy))
    for mode in async_rl.MODES:
        trainer, engine = async_rl.run(mode, Settings(steps=settings["async_steps"]))
        record["async"][mode] = {
            "trainer": {k: sum(v) for k, v in trainer.phases.items()},
            "engine": {k: sum(v) for k, v in engine.phases.items()},
            "trainer_seconds": sum(trainer.step_seconds), "engine_seconds": sum(engine.step_seconds),
            "steps": settings["async_steps"], "sync_bytes": trainer.sync_bytes,
        }
        log(f"two processes, {mode}: {sum(trainer.step_seconds):.2f} s for {settings['async_steps']} steps")
    record["meta"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "eval_samples": EVAL_SAMPLES,
        "seconds": round(time.perf_counter() - start, 1), "settings": settings,
    }
    return record


def summary(record: dict) -> str:
    """Final accuracy per mode (mean and range over seeds) and the two-process step times."""
    lines = []
    for off in (False, True):
        finals = [r["accuracy"][-1] for r in record["runs"] if r["off_policy"] == off]
        starts = [r["accuracy"][0] for r in record["runs"] if r["off_policy"] == off]
        lines.append(f"{'one step off' if off else 'on-policy':12}: accuracy {statistics.mean(starts):.3f} -> "
                     f"{statistics.mean(finals):.3f} (seeds {min(finals):.3f} to {max(finals):.3f})")
    for mode, a in record["async"].items():
        lines.append(f"two processes, {mode:5}: {a['trainer_seconds']:.2f} s for {a['steps']} steps")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny settings: a smoke test")
    parser.add_argument("--out", type=Path, default=None, help="where to write the JSON")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    record = run(settings)
    out = args.out or RESULTS / ("grpo_engine-quick.json" if args.quick else "grpo_engine.json")
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(summary(record))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
