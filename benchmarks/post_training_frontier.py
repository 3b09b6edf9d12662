"""Accuracy against KL to the SFT reference for GRPO, DPO and expert iteration on the tiny arithmetic model.

Labs 04 and 05 of part 4 train one GRPO and one DPO run with different budgets and
one seed each; that says nothing about which method is ahead *at equal KL*. This
script sweeps the knob that sets each method's distance to the reference
(``beta`` for GRPO and DPO, the number of rounds for expert iteration) over
several seeds and records every final point, as Gao et al. (arXiv:2210.10760)
plot reward against KL. It also runs the GRPO-bias ablation of lab 04
(``scale_rewards`` group / none x ``loss_type`` grpo / dr_grpo, Dr. GRPO,
arXiv:2503.20783).

Each seed rebuilds the labs' SFT model (pre-training and a rank-4 LoRA SFT) with
its own model initialisation and batch order; seed 0 is the labs' model. The
training settings are the labs' (GRPO: 100 steps of 16 prompts x 8 samples, lr
3e-3, 2 inner epochs; DPO: 100 steps of 64 pairs from 16 samples per problem,
lr 1e-3); accuracy and KL are measured on 16 samples of each of the 100
problems (``utils.rl.post_training.evaluate``).

    OMP_NUM_THREADS=1 python -m benchmarks.post_training_frontier            # about 15 min on one core
    OMP_NUM_THREADS=1 python -m benchmarks.post_training_frontier --quick    # seconds: tiny sizes, a smoke test

Writes ``benchmarks/results/post_training_frontier.json`` (``--quick``: ``-quick.json``, or ``--out``).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import platform
import time
from pathlib import Path
from typing import Sequence

import torch

from utils.rl import lora
from utils.rl.post_training import (evaluate, expert_iteration, frozen_copy, lengths_by_correctness,
                                    preference_pairs, train_dpo, train_grpo)
from utils.rl.tiny_lm import TinyLM, all_prompts, arithmetic_corpus, prompt_tokens, sample, train_lm

RESULTS = Path(__file__).resolve().parent / "results"

FULL = {
    "seeds": [0, 1, 2, 3, 4],
    "pretrain_steps": 600, "sft_steps": 100,
    "grpo_betas": [0.0, 0.04, 0.2, 1.0], "grpo_steps": 100, "grpo_lr": 3e-3,
    "dpo_betas": [0.1, 0.25, 0.5, 1.0, 2.0], "dpo_steps": 100, "dpo_lr": 1e-3, "dpo_pair_samples": 16,
    "ei_rounds": 3, "ei_samples": 8, "ei_steps": 50, "ei_lr": 1e-3,
    "variants": [["group", "grpo"], ["none", "grpo"], ["group", "dr_grpo"], ["none", "dr_grpo"]],
    "variant_beta": 0.04,
    "eval_samples": 16, "eval_every": 25,
}
QUICK = {
    "seeds": [0, 1],
    "pretrain_steps": 60, "sft_steps": 20,
    "grpo_betas": [0.04], "grpo_steps": 6, "grpo_lr": 3e-3,
    "dpo_betas": [0.5], "dpo_steps": 6, "dpo_lr": 1e-3, "dpo_pair_samples": 8,
    "ei_rounds": 1, "ei_samples": 4, "ei_steps": 5, "ei_lr": 1e-3,
    "variants": [["none", "dr_grpo"]],
    "variant_beta": 0.04,
    "eval_samples": 2, "eval_every": 3,
}
"""The settings of the full sweep and of ``--quick`` (a smoke test: the models barely train)."""


def sft_model(seed: int, settings: dict) -> torch.nn.Module:
    """The labs' SFT model with model seed ``seed`` (seed 0 is labs 04 and 05's model exactly)."""
    problems = all_prompts()
    base = TinyLM(seed=seed)
    train_lm(base, arithmetic_corpus(20_000, noise=0.5, seed=0), steps=settings["pretrain_steps"], lr=3e-3,
             batch_size=128, seed=seed, desc="pre-train")
    sft = lora.apply_lora(copy.deepcopy(base), rank=4, alpha=8.0, targets=("q", "v", "o", "up", "down"))
    train_lm(sft, arithmetic_corpus(2000, noise=0.0, seed=1, problems=problems[::2]), steps=settings["sft_steps"],
             lr=1e-3, batch_size=64, response_only=True, seed=seed + 1, desc="SFT")
    return sft


def measure(policy: torch.nn.Module, ref: torch.nn.Module, settings: dict) -> dict[str, float]:
    """Accuracy, KL to ``ref`` and the mean length of right and wrong answers, on ``eval_samples`` per problem."""
    problems = all_prompts()
    accuracy, kl = evaluate(policy, ref, problems, samples_per_problem=settings["eval_samples"], seed=1000)
    seq, _ = sample(policy, prompt_tokens(problems).repeat_interleave(settings["eval_samples"], 0),
                    generator=torch.Generator().manual_seed(1001))
    len_right, len_wrong = lengths_by_correctness(seq)
    return {"accuracy": accuracy, "kl": kl, "len_right": len_right, "len_wrong": len_wrong}


def run_seed(seed: int, settings: dict, log=print) -> dict[str, list[dict]]:
    """Every method and knob of the sweep from one seed's SFT model; a list of point records per section."""
    problems = all_prompts()
    sft = sft_model(seed, settings)
    ref = frozen_copy(sft)
    out: dict[str, list[dict]] = {"sft": [], "points": [], "grpo_variants": []}
    out["sft"].append({"seed": seed, **measure(sft, ref, settings)})
    sft_accuracy = out["sft"][0]["accuracy"]
    log(f"seed {seed}: SFT accuracy {sft_accuracy:.3f}")

    def measure_gain(policy: torch.nn.Module) -> dict[str, float]:
        """:func:`measure`, plus ``gain``: the accuracy minus this seed's SFT accuracy (a paired difference)."""
        m = measure(policy, ref, settings)
        return {**m, "gain": m["accuracy"] - sft_accuracy}

    for beta in settings["grpo_betas"]:
        policy = copy.deepcopy(sft)
        hist = train_grpo(policy, ref, problems, steps=settings["grpo_steps"], prompts_per_step=16, group_size=8,
                          lr=settings["grpo_lr"], beta=beta, clip=0.2, inner_epochs=2, seed=seed,
                          eval_problems=problems, eval_every=settings["eval_every"])
        point = {"method": "grpo", "beta": beta, "seed": seed, **measure_gain(policy),
                 "trajectory": {"step": hist["eval_step"], "accuracy": hist["eval_reward"], "kl": hist["eval_kl"]}}
        out["points"].append(point)
        log(f"seed {seed}: GRPO beta {beta}: accuracy {point['accuracy']:.3f}, KL {point['kl']:.3f}")
    chosen, rejected = preference_pairs(sft, problems, samples_per_problem=settings["dpo_pair_samples"], seed=seed)
    for beta in settings["dpo_betas"]:
        policy = copy.deepcopy(sft)
        hist = train_dpo(policy, ref, chosen, rejected, steps=settings["dpo_steps"], beta=beta,
                         lr=settings["dpo_lr"], batch_size=64, seed=seed, eval_problems=problems,
                         eval_every=settings["eval_every"])
        point = {"method": "dpo", "beta": beta, "seed": seed, "pairs": len(chosen), **measure_gain(policy),
                 "trajectory": {"step": hist["eval_step"], "accuracy": hist["reward"], "kl": hist["kl"]}}
        out["points"].append(point)
        log(f"seed {seed}: DPO beta {beta}: accuracy {point['accuracy']:.3f}, KL {point['kl']:.3f}")
    policy = copy.deepcopy(sft)
    for k in range(settings["ei_rounds"]):
        hist = expert_iteration(policy, ref, problems, rounds=1, samples_per_problem=settings["ei_samples"],
                                steps=settings["ei_steps"], lr=settings["ei_lr"], seed=seed * 10 + k)
        point = {"method": "expert_iteration", "rounds": k + 1, "seed": seed, "accepted": hist["accepted"][0],
                 **measure_gain(policy)}
        out["points"].append(point)
        log(f"seed {seed}: expert iteration, {k + 1} round(s): accuracy {point['accuracy']:.3f}, "
            f"KL {point['kl']:.3f}")
    for scale_rewards, loss_type in settings["variants"]:
        policy = copy.deepcopy(sft)
        train_grpo(policy, ref, problems, steps=settings["grpo_steps"], prompts_per_step=16, group_size=8,
                   lr=settings["grpo_lr"], beta=settings["variant_beta"], clip=0.2, inner_epochs=2, seed=seed,
                   scale_rewards=scale_rewards, loss_type=loss_type)
        point = {"scale_rewards": scale_rewards, "loss_type": loss_type, "seed": seed,
                 **measure_gain(policy)}
        out["grpo_variants"].append(point)
        log(f"seed {seed}: GRPO scale_rewards={scale_rewards}, loss_type={loss_type}: "
            f"accuracy {point['accuracy']:.3f}, KL {point['kl']:.3f}")
    return out


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, math.sqrt(var)


def summarise(points: list[dict], keys: tuple[str, ...]) -> list[dict]:
    """One row per setting (the values of ``keys``): the number of seeds, mean and std of accuracy and KL."""
    groups: dict[tuple, list[dict]] = {}
    for p in points:
        groups.setdefault(tuple(p.get(k) for k in keys), []).append(p)
    rows = []
    for setting, members in groups.items():
        row = dict(zip(keys, setting))
        row["n_seeds"] = len(members)
        for metric in ("accuracy", "gain", "kl", "len_right", "len_wrong"):
            values = [m[metric] for m in members if metric in m and not math.isnan(m[metric])]
            if values:
                row[f"{metric}_mean"], row[f"{metric}_std"] = _mean_std(values)
        rows.append(row)
    return rows


def sweep(settings: dict, log=print) -> dict:
    """The whole sweep: every seed of :func:`run_seed`, then the per-setting summaries, with the run's metadata."""
    start = time.perf_counter()
    record: dict = {"sft": [], "points": [], "grpo_variants": []}
    for seed in settings["seeds"]:
        for section, rows in run_seed(seed, settings, log).items():
            record[section].extend(rows)
    record["summary"] = summarise(record["points"], ("method", "beta", "rounds"))
    record["grpo_variants_summary"] = summarise(record["grpo_variants"], ("scale_rewards", "loss_type"))
    record["sft_summary"] = summarise([{**p, "method": "sft"} for p in record["sft"]], ("method",))
    record["meta"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
        "threads": torch.get_num_threads(), "seconds": round(time.perf_counter() - start, 1),
        "settings": settings,
    }
    return record


def format_summary(record: dict) -> str:
    """The summary rows as a table: setting, seeds, accuracy and KL as mean +- std."""
    lines = ["method             knob         seeds  accuracy         gain over SFT     KL (nats)"]
    for row in record["sft_summary"] + record["summary"]:
        knob = "" if row["method"] == "sft" else (f"rounds {row['rounds']}" if row.get("rounds") else
                                                 f"beta {row['beta']}")
        gain = f"{row['gain_mean']:+.3f} +- {row['gain_std']:.3f}" if "gain_mean" in row else " " * 15
        lines.append(f"{row['method']:18s} {knob:12s} {row['n_seeds']:5d}  {row['accuracy_mean']:.3f} +- "
                     f"{row['accuracy_std']:.3f}  {gain}  {row['kl_mean']:.3f} +- {row['kl_std']:.3f}")
    lines.append("GRPO variants      scale/loss   seeds  accuracy         gain over SFT     KL (nats)        "
                 "len right  len wrong")
    for row in record["grpo_variants_summary"]:
        lines.append(f"{row['scale_rewards'] + '/' + row['loss_type']:31s} {row['n_seeds']:5d}  "
                     f"{row['accuracy_mean']:.3f} +- {row['accuracy_std']:.3f}  {row['gain_mean']:+.3f} +- "
                     f"{row['gain_std']:.3f}  {row['kl_mean']:.3f} +- "
                     f"{row['kl_std']:.3f}  {row.get('len_right_mean', float('nan')):9.3f}  "
                     f"{row.get('len_wrong_mean', float('nan')):9.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, two seeds: a smoke test")
    parser.add_argument("--out", type=Path, default=None, help="where to write the JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    settings = QUICK if args.quick else FULL
    record = sweep(settings)
    print(format_summary(record))
    out = args.out or RESULTS / ("post_training_frontier-quick.json" if args.quick else "post_training_frontier.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
    return record


if __name__ == "__main__":
    main()
