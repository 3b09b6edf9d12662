"""Where the rollout engine lives: the memory and the timeline of one RL step under each placement.

An RL step alternates two programs over the same weights: an inference engine
(vLLM, SGLang) that decodes the rollouts, and a trainer (ZeRO-3 / FSDP) that
scores them and updates the weights. Three placements (chapter "Post-training
at scale"):

- ``"colocated"``: both on all GPUs, one after the other (TRL's
  ``vllm_mode="colocate"``, OpenRLHF's ``--colocate_all_models``, verl's
  3D-HybridEngine, Sheng et al. 2024, arXiv:2409.19256). With sleep mode
  (TRL's ``vllm_enable_sleep_mode``, OpenRLHF's ``--vllm_enable_sleep``) the
  engine frees its weights and KV cache while the trainer runs, and the
  trainer offloads its gradients and Adam state while the engine runs;
- ``"disaggregated"``: the engine on ``n_rollout_gpus`` GPUs, the trainer on
  the rest, each idle while the other works (TRL's ``vllm_mode="server"``,
  OpenRLHF without colocation); the weights go over NCCL to the engine;
- ``"async"``: disaggregated, but the engine generates batch ``k + 1`` while
  the trainer trains on batch ``k`` (OpenRLHF's ``--async_train``, TRL's
  ``AsyncGRPOTrainer``): samples one policy version stale, corrected by the
  importance ratio against the old log-probs.

Times come from :func:`utils.rl.rlhf_cost.rlhf_step_time` and
:func:`~utils.rl.rlhf_cost.generation_seconds`; memory from
:func:`~utils.rl.rlhf_cost.rlhf_memory_bytes` and
:func:`utils.attention.kv_cache.kv_cache_bytes`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from utils.attention.kv_cache import kv_cache_bytes
from utils.parallel.memory import zero_model_state_breakdown
from utils.rl.rlhf_cost import (NIC_BANDWIDTH, PolicyModel, generation_seconds, rlhf_memory_bytes, rlhf_step_time,
                                weight_sync_seconds)
from utils.validate import check_positive_int

PLACEMENTS = ("colocated", "disaggregated", "async")


def generator_memory_bytes(model: PolicyModel, tp: int, sequences_per_replica: int, context: int) -> dict[str, float]:
    """Bytes per GPU of one rollout-engine replica: bf16 weights ``2 Psi / tp`` and the KV cache of its batch.

    Decoding reads whole weights every step (not ZeRO shards), so each GPU of a
    ``tp``-way replica holds ``1 / tp`` of them: 13.5 GB for LLaMA-2-7B at
    ``tp=1``, 34.5 GB for LLaMA-2-70B at ``tp=4``. The KV cache of
    ``sequences_per_replica`` sequences of ``context`` tokens
    (:func:`utils.attention.kv_cache.kv_cache_bytes`) is split over the ``tp``
    GPUs by KV head.
    """
    check_positive_int("tp", tp)
    check_positive_int("sequences_per_replica", sequences_per_replica)
    check_positive_int("context", context)
    c = model.attention
    cache = kv_cache_bytes(c.n_layers, c.n_kv_heads, c.head_dim, seq_len=context, batch=sequences_per_replica)
    return {"generator weights": 2.0 * model.n_params / tp, "KV cache": cache / tp}


def _check_split(placement: str, n_gpus: int, tp: int, n_rollout_gpus: int | None) -> int:
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    check_positive_int("n_gpus", n_gpus)
    check_positive_int("tp", tp)
    if placement == "colocated":
        if n_gpus % tp:
            raise ValueError(f"n_gpus ({n_gpus}) must be a multiple of tp ({tp})")
        return n_gpus
    if n_rollout_gpus is None:
        raise ValueError(f"placement {placement!r} needs n_rollout_gpus, the GPUs of the rollout engine")
    check_positive_int("n_rollout_gpus", n_rollout_gpus)
    if n_rollout_gpus >= n_gpus or n_rollout_gpus % tp:
        raise ValueError(f"n_rollout_gpus ({n_rollout_gpus}) must be a multiple of tp ({tp}) and leave trainer GPUs "
                         f"out of n_gpus ({n_gpus})")
    return n_rollout_gpus


def placement_memory_bytes(algorithm: str, model: PolicyModel, n_gpus: int, tp: int, sequences: int, context: int,
                           placement: str = "colocated", sleep: bool = False, n_rollout_gpus: int | None = None,
                           **memory_kwargs) -> dict[str, dict[str, float]]:
    """Bytes per GPU by component, for each kind of GPU (or phase) of ``placement``; ZeRO-3 for the trainer.

    ``"colocated"`` without ``sleep``: every GPU holds the model states of
    :func:`~utils.rl.rlhf_cost.rlhf_memory_bytes` and the generator's weights
    and KV cache at once (``{"every GPU": ...}``). With ``sleep``, two phases:
    training holds the model states; generation holds the generator, the
    frozen models' shards and the trained models' bf16 shards (gradients and
    Adam state offloaded). ``"disaggregated"`` and ``"async"``:
    ``{"trainer GPU": states over n_gpus - n_rollout_gpus, "rollout GPU": generator}``.
    ``sequences`` are split evenly over the ``n_rollout / tp`` replicas.
    ``memory_kwargs`` go to ``rlhf_memory_bytes`` (``reference``, ``reward_params``, ...).
    """
    n_rollout = _check_split(placement, n_gpus, tp, n_rollout_gpus)
    check_positive_int("sequences", sequences)
    if not isinstance(sleep, bool):
        raise ValueError(f"sleep must be True or False, got {sleep!r}")
    per_replica = math.ceil(sequences / (n_rollout // tp))
    generator = generator_memory_bytes(model, tp, per_replica, context)
    if placement != "colocated":
        states = rlhf_memory_bytes(algorithm, model.n_params, n_gpus - n_rollout, 3, **memory_kwargs)
        return {"trainer GPU": states, "rollout GPU": generator}
    states = rlhf_memory_bytes(algorithm, model.n_params, n_gpus, 3, **memory_kwargs)
    if not sleep:
        return {"every GPU": {**states, **generator}}
    weights_only = zero_model_state_breakdown(model.n_params, n_gpus, 3).params
    value_params = memory_kwargs.get("value_params", model.n_params)
    resident = {"policy": weights_only, "reference": states["reference"], "reward": states["reward"],
                "value": zero_model_state_breakdown(value_params, n_gpus, 3).params if states["value"] else 0.0}
    return {"training phase": states, "generation phase": {**resident, **generator}}


@dataclass(frozen=True)
class Segment:
    """One bar of a timeline: ``lane`` (a group of GPUs) runs ``phase`` of step ``step`` from ``start`` to ``end`` s."""

    lane: str
    phase: str
    step: int
    start: float
    end: float


def step_timeline(placement: str, algorithm: str, model: PolicyModel, n_prompts: int, group_size: int,
                  prompt_len: int, response_len: int, n_gpus: int = 8, tp: int = 1, n_rollout_gpus: int | None = None,
                  n_steps: int = 2, **step_kwargs) -> list[Segment]:
    """The phases of ``n_steps`` RL steps under ``placement``, as bars on one lane per group of GPUs.

    Colocated: generation, then old log-probs and scoring, training (with
    exposed ZeRO-3 communication) and the weight resharding, all on all GPUs
    (:func:`~utils.rl.rlhf_cost.rlhf_step_time`). Disaggregated: generation on
    the ``n_rollout_gpus``, the rest on the trainer's GPUs, then a broadcast of
    ``2 Psi`` bytes at the NIC bandwidth (both lanes wait for it). Async: the
    engine starts batch ``k + 1`` as soon as it has the weights the trainer
    produced from batch ``k - 1``, so generation overlaps training and every
    trained batch is one version stale. ``step_kwargs`` go to ``rlhf_step_time``.
    """
    n_rollout = _check_split(placement, n_gpus, tp, n_rollout_gpus)
    check_positive_int("n_steps", n_steps)
    if placement == "colocated":
        t = rlhf_step_time(algorithm, model, n_prompts, group_size, prompt_len, response_len, n_gpus, tp,
                           **step_kwargs)
        lane, now, out = f"all {n_gpus} GPUs", 0.0, []
        for k in range(n_steps):
            for phase, seconds in (("generation", t.generation), ("log-probs + scoring", t.old_log_probs + t.scoring),
                                   ("training", t.training + t.communication), ("weight sync", t.weight_sync)):
                out.append(Segment(lane, phase, k, now, now + seconds))
                now += seconds
        return out
    n_train = n_gpus - n_rollout
    gen = generation_seconds(model, n_prompts * group_size, prompt_len, response_len, n_rollout, tp,
                             step_kwargs.get("gpu", "H100-SXM"), step_kwargs.get("mfu", 0.4),
                             step_kwargs.get("lengths", "longest"),
                             step_kwargs.get("mean_response_len") or response_len, step_kwargs.get("decode_fraction"))
    t = rlhf_step_time(algorithm, model, n_prompts, group_size, prompt_len, response_len, n_train, 1,
                       **{**step_kwargs, "weight_sync": False, "generate": False})
    score, train = t.old_log_probs + t.scoring, t.training + t.communication
    sync = weight_sync_seconds(model.n_params, n_gpus, tp, NIC_BANDWIDTH, colocated=False)
    roll, trainer = f"rollout ({n_rollout} GPUs)", f"trainer ({n_train} GPUs)"
    out: list[Segment] = []
    gen_end, weights_ready = gen, 0.0  # batch 0 starts at 0 with the initial weights
    out.append(Segment(roll, "generation", 0, 0.0, gen))
    trainer_free = 0.0
    for k in range(n_steps):
        start = max(gen_end, trainer_free)
        out.append(Segment(trainer, "log-probs + scoring", k, start, start + score))
        out.append(Segment(trainer, "training", k, start + score, start + score + train))
        done = start + score + train
        if placement == "async" and k + 1 < n_steps:  # batch k + 1 decodes while batch k trains, with the
            gen_start = max(gen_end, weights_ready)  # weights of step k - 1: one version stale
            out.append(Segment(roll, "generation", k + 1, gen_start, gen_start + gen))
            gen_end = gen_start + gen
        sync_start = max(done, gen_end) if placement == "async" else done
        for lane in (roll, trainer):
            out.append(Segment(lane, "weight sync", k, sync_start, sync_start + sync))
        weights_ready = trainer_free = sync_start + sync
        if placement == "disaggregated" and k + 1 < n_steps:
            out.append(Segment(roll, "generation", k + 1, weights_ready, weights_ready + gen))
            gen_end = weights_ready + gen
    return out


def steady_step_seconds(segments: list[Segment]) -> float:
    """Seconds between the trainer's starts of the last two steps (the steady-state step time); needs 2 steps.

    The trainer's start, not the end of a step's sync: after the last step no
    generation is left to wait for, so the last sync comes early.
    """
    starts = sorted(s.start for s in segments if s.phase == "log-probs + scoring")
    if len(starts) < 2:
        raise ValueError("the timeline needs at least two steps (n_steps >= 2)")
    return starts[-1] - starts[-2]
