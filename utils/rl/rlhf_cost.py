"""What one RLHF step holds in GPU memory and where its time goes: PPO, GRPO and DPO on N GPUs.

**Memory.** RLHF keeps up to four models (Ouyang et al. 2022, arXiv:2203.02155,
section 3.5; Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, section 4.1):

- the policy, trained: weights, gradients and Adam state, ``(2 + 2 + 12) Psi``;
- the reference policy, frozen: weights only, ``2 Psi`` (for the KL penalty);
- the reward model, frozen: ``2 Psi_rm``;
- the value model (critic), trained like the policy: PPO only. GRPO replaces it
  by the mean reward of a group of samples; DPO needs neither reward nor value
  model, and its reference log-probabilities can be computed once before
  training (Rafailov et al. 2023, arXiv:2305.18290), so it keeps the policy alone.

Each is sharded by ZeRO (:func:`utils.parallel.memory.zero_model_state_breakdown`):
at stage 3 a frozen model's weights are split over the ``n_gpus`` too.
These are the trainer's states; the rollout engine's own, unsharded copy of
the weights and its KV cache are counted in :mod:`utils.rl.rollout_systems`.

**Time.** A PPO or GRPO step (1) *generates* ``G`` responses of ``R`` tokens to
each of ``n_prompts`` prompts of ``P`` tokens: a prefill of the prompts, then
``R`` decode steps of batch ``B = n_prompts x G``, each one read of the weights
plus the KV caches (:func:`utils.attention.decode_cost.decode_step_cost`, at its
roofline bound), spread over ``n_gpus / tp`` replicas with ideal TP scaling;
(2) recomputes the *old policy's log-probabilities* of the samples with the
trainer (``2 N`` FLOPs per token; PPO's ratio needs them, and TRL's GRPO
computes them whenever ``num_iterations > 1`` or the vLLM importance-sampling
correction is on); (3) *scores* the tokens with forward passes of the reference,
reward and value models (``2 N`` each); (4) *trains* the policy (and PPO's value
model) for ``epochs`` passes over the samples (TRL's ``PPOConfig.num_ppo_epochs``,
default 4; GRPO's ``mu``, ``num_iterations``), ``6 N`` FLOPs per token per pass
(Kaplan et al. 2020, arXiv:2001.08361); (5) pays the *exposed*
communication of the trainer (:data:`TRAINERS`). A ZeRO-3 trainer (DeepSpeed,
FSDP; ``trainer="zero3"``) all-gathers a model's weights for each
micro-batch's forward (and again for its backward, plus a gradient
reduce-scatter, when trained),
:func:`utils.parallel.memory.zero_communication_volume`, of which only what
exceeds the micro-batch's compute is charged (prefetch overlaps the rest). A
Megatron trainer (``trainer="megatron"``: TP x PP model parallelism, the
distributed optimizer over DP = ``n_gpus / (tp pp)``) keeps its weights and
synchronises once per optimizer step: a bf16 gradient reduce-scatter and a
parameter all-gather of its ``2 Psi / (tp pp)`` bytes over the DP ring, each
``(DP - 1) / DP`` of them per GPU, charged in full (Megatron-LM's
``overlap_grad_reduce`` would hide some);
(6) *syncs* the new weights to the rollout engine: on the same GPUs, each GPU
gathers the ``1 / tp`` slice it decodes from the ZeRO-3 shards
(:func:`weight_sync_seconds`). Scoring, training and prefill run at ``mfu`` of
the GPUs' peak.

Which side each simplification favours (generation's share of the step):

- decoding at its roofline bound (unless ``decode_fraction``), ideal TP, no kernel launches, no KV-cache
  limit on the batch: generation looks faster, its share *smaller*;
- every response as long as the longest (``lengths="longest"``, the default;
  ``mean_response_len`` lets the trained tokens be fewer): decode steps are set
  by the longest response, but the batch shrinks as shorter ones finish, so
  this over-charges generation; ``lengths="exponential"`` decodes a censored
  exponential of the mean instead (:func:`response_lengths`), an assumed shape;
- training at a fixed ``mfu`` with no padding and no optimizer-step time, and
  no recompute unless ``recompute``: training looks faster, the share *larger*;
- all models of the policy's size unless told (InstructGPT used a 6B reward
  and value model for its 175B policy): training and scoring look *slower*,
  the share smaller.

So the share is an estimate, not a bound either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from utils.attention.decode_cost import FFN_AND_VOCAB, param_count, params_read_per_step
from utils.attention.kv_cache import MODELS, AttentionConfig
from utils.gpu import hardware
from utils.parallel.memory import zero_communication_volume, zero_model_state_breakdown
from utils.parallel.training import FORWARD_FLOPS_PER_PARAM_PER_TOKEN, TRAINING_FLOPS_PER_PARAM_PER_TOKEN
from utils.validate import check_positive, check_positive_int

ALGORITHMS = ("ppo", "grpo", "dpo")

TRAINERS = ("zero3", "megatron")
"""How the trainer shards the policy (module docstring, point 5): ZeRO-3 (DeepSpeed, FSDP) or Megatron's model
parallelism with a distributed optimizer (NeMo RL's Megatron backend, verl's Megatron workers)."""

MODEL_NAMES = ("LLaMA-2-7B", "LLaMA-2-70B", "Llama-3-8B", "Llama-3-70B")
"""The policies the cost model offers (their sizes: :data:`utils.attention.decode_cost.FFN_AND_VOCAB`)."""


@dataclass(frozen=True)
class PolicyModel:
    """A LLaMA-style model's parameter count, the parameters a decode step reads, its attention and FFN sizes."""

    name: str
    n_params: int
    n_params_read: int
    attention: AttentionConfig
    intermediate: int


def policy_model(name: str) -> PolicyModel:
    """One of :data:`MODEL_NAMES`, counted by :func:`utils.attention.decode_cost.param_count`."""
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}")
    return PolicyModel(name, param_count(name), params_read_per_step(name), MODELS[name], FFN_AND_VOCAB[name][0])


def _check_algorithm(algorithm: str) -> str:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    return algorithm


def rlhf_memory_bytes(algorithm: str, n_params: float, n_gpus: int = 1, stage: int = 3,
                      reward_params: float | None = None, value_params: float | None = None,
                      reference: bool = True, precompute_ref_log_probs: bool = True) -> dict[str, float]:
    """Model-state bytes per GPU of each model an ``algorithm`` step holds: policy, reference, reward, value.

    Trained models (policy; value for PPO) cost ``zero_model_state_bytes``; frozen
    ones (reference, reward) their fp16 weights, ``zero_model_state_breakdown(...).params``.
    ``reward_params`` and ``value_params`` default to ``n_params``. ``reference=False``
    drops the KL reference of PPO/GRPO (TRL's GRPO with ``beta=0``); for DPO the
    reference is held only if ``precompute_ref_log_probs`` is False. Absent models are 0.
    """
    _check_algorithm(algorithm)
    check_positive("n_params", n_params)
    reward_params = n_params if reward_params is None else check_positive("reward_params", reward_params)
    value_params = n_params if value_params is None else check_positive("value_params", value_params)
    for name, flag in (("reference", reference), ("precompute_ref_log_probs", precompute_ref_log_probs)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be True or False, got {flag!r}")

    def trained(n: float) -> float:
        return zero_model_state_breakdown(n, n_gpus, stage).total

    def frozen(n: float) -> float:
        return zero_model_state_breakdown(n, n_gpus, stage).params

    holds_ref = (not precompute_ref_log_probs) if algorithm == "dpo" else reference
    return {
        "policy": trained(n_params),
        "reference": frozen(n_params) if holds_ref else 0.0,
        "reward": frozen(reward_params) if algorithm != "dpo" else 0.0,
        "value": trained(value_params) if algorithm == "ppo" else 0.0,
    }


@dataclass(frozen=True)
class StepTime:
    """Seconds of one RLHF step by phase (module docstring); ``total`` and ``generation_share`` follow."""

    generation: float
    scoring: float
    training: float
    old_log_probs: float = 0.0
    communication: float = 0.0
    weight_sync: float = 0.0

    @property
    def total(self) -> float:
        return (self.generation + self.scoring + self.training + self.old_log_probs + self.communication
                + self.weight_sync)

    @property
    def generation_share(self) -> float:
        return self.generation / self.total


NIC_BANDWIDTH = 50e9
"""Bytes/s per GPU, one direction, between nodes: one 400 Gb/s NDR InfiniBand NIC per GPU (as
:class:`utils.parallel.planning.planner.Cluster`'s default)."""


def link_bandwidth(gpu: str | hardware.GpuSpec = "H100-SXM", n_gpus: int = 8, gpus_per_node: int = 8) -> float:
    """Bytes/s per GPU, one direction, of the slowest link ``n_gpus`` GPUs use: NVLink in one node, else the NIC.

    NVLink's datasheet figure counts both directions (900 GB/s on an H100), so one direction is half.
    """
    check_positive_int("n_gpus", n_gpus)
    check_positive_int("gpus_per_node", gpus_per_node)
    return hardware.spec(gpu).nvlink_bandwidth / 2 if n_gpus <= gpus_per_node else NIC_BANDWIDTH


def weight_sync_seconds(n_params: float, n_gpus: int, tp: int, bandwidth_bytes_per_s: float,
                        colocated: bool = True) -> float:
    """Seconds to hand the trainer's new bf16 weights to the rollout engine.

    Colocated (DeepSpeed-Chat's Hybrid Engine, verl's 3D-HybridEngine, TRL's
    ``vllm_mode="colocate"``): each GPU holds ``2 Psi / n_gpus`` bytes under
    ZeRO-3 and decodes with the ``2 Psi / tp`` slice of its TP group, so it
    receives ``2 Psi (1 / tp - 1 / n_gpus)`` bytes, all GPUs at once.
    Disaggregated (OpenRLHF's and TRL's NCCL broadcast to vLLM): the trainer
    sends all ``2 Psi`` bytes from one rank, pipelined to every rollout GPU at
    ``bandwidth_bytes_per_s``; ``n_gpus`` and ``tp`` do not matter.
    """
    check_positive("n_params", n_params)
    _check_parallel(n_gpus, tp)
    check_positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    if not isinstance(colocated, bool):
        raise ValueError(f"colocated must be True or False, got {colocated!r}")
    nbytes = 2 * n_params * (1 / tp - 1 / n_gpus) if colocated else 2 * n_params
    return nbytes / bandwidth_bytes_per_s


LENGTH_MODELS = ("longest", "exponential")
"""How long the responses of a step are: every one as long as the longest allowed, or
:func:`response_lengths`' censored exponential with the published mean."""


def response_lengths(n_sequences: int, mean_len: float, max_len: int) -> np.ndarray:
    """``n_sequences`` response lengths with mean ``mean_len``, none longer than ``max_len``: a censored exponential.

    ``L = min(ceil(X), max_len)`` with ``X`` exponential of scale ``theta``, so
    ``E[L] ~ theta (1 - exp(-max_len / theta))``; ``theta`` is found by bisection
    so that the lengths' mean is ``mean_len``. The share ``exp(-max_len / theta)``
    hits the cap, as truncated responses do in RL. The lengths sit at the
    quantiles ``(i + 1/2) / n``, so the result is deterministic. An assumption:
    the published runs give the mean length, not the distribution, and decode
    time depends on the tail (the step ends when the longest response does).
    """
    check_positive_int("n_sequences", n_sequences)
    check_positive_int("max_len", max_len)
    if not 1 <= check_positive("mean_len", mean_len) < max_len:
        raise ValueError(f"mean_len must be in [1, max_len = {max_len}), got {mean_len!r}")
    u = (np.arange(n_sequences) + 0.5) / n_sequences

    def lengths(theta: float) -> np.ndarray:
        return np.minimum(np.maximum(np.ceil(-theta * np.log1p(-u)), 1), max_len)

    lo, hi = 1e-9, 1e9
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if lengths(mid).mean() < mean_len else (lo, mid)
    return lengths(hi)[::-1].astype(np.int64)


def generation_seconds(model: PolicyModel, n_sequences: int, prompt_len: int, response_len: int,
                       n_gpus: int = 8, tp: int = 1, gpu: str | hardware.GpuSpec = "H100-SXM", mfu: float = 0.4,
                       lengths: str = "longest", mean_response_len: float | None = None,
                       decode_fraction: Callable[[int], float] | None = None) -> float:
    """Seconds to generate ``response_len`` tokens for each of ``n_sequences`` sequences on ``n_gpus`` GPUs.

    The sequences are split over ``n_gpus / tp`` replicas; a replica prefills its
    prompts (``2 N P`` FLOPs each, at ``mfu`` of peak) and then runs decode
    steps, step ``t`` at context ``P + t``, each at its roofline bound
    (:func:`utils.gpu.roofline.min_seconds`) divided by ``tp``. With
    ``lengths="longest"`` every sequence decodes ``response_len`` tokens; with
    ``"exponential"`` the lengths are :func:`response_lengths` of mean
    ``mean_response_len`` capped at ``response_len``, dealt to the replicas in
    turn from the longest, and step ``t`` of the slowest replica decodes only its
    sequences still running. ``decode_fraction(batch)``, if given, is the
    fraction of the roof a decode step of that batch reaches (e.g.
    :func:`utils.serving.costs.calibrated.decode_fraction`); each step's time
    is divided by it. Raises ``ValueError`` if the bf16 weights split ``tp``
    ways do not fit in one GPU.
    """
    check_positive_int("n_sequences", n_sequences)
    check_positive_int("prompt_len", prompt_len)
    check_positive_int("response_len", response_len)
    _check_parallel(n_gpus, tp)
    _check_mfu(mfu)
    if lengths not in LENGTH_MODELS:
        raise ValueError(f"lengths must be one of {LENGTH_MODELS}, got {lengths!r}")
    g = hardware.spec(gpu)
    if 2 * model.n_params / tp >= g.hbm_bytes:
        raise ValueError(f"{model.name}'s bf16 weights ({2 * model.n_params / 1e9:.0f} GB) split {tp} ways do not fit "
                         f"in one {gpu} ({g.hbm_bytes / 1e9:.0f} GB): raise tp")
    replicas = n_gpus // tp
    per_replica = math.ceil(n_sequences / replicas)
    prefill = FORWARD_FLOPS_PER_PARAM_PER_TOKEN * model.n_params_read * per_replica * prompt_len
    seconds = prefill / (g.flops("bf16") * mfu * tp)
    if lengths == "longest":
        batches = np.full(response_len, per_replica)
    else:
        if mean_response_len is None:
            raise ValueError('lengths="exponential" needs mean_response_len, the published mean response length')
        slowest = response_lengths(n_sequences, mean_response_len, response_len)[::replicas]
        batches = (slowest[None, :] > np.arange(response_len)[:, None]).sum(axis=1)
        batches = batches[batches > 0]
    contexts = np.arange(prompt_len, prompt_len + len(batches))
    steps = _decode_step_seconds(model, batches, contexts, gpu) / tp
    if decode_fraction is not None:
        fractions = {int(b): decode_fraction(int(b)) for b in np.unique(batches)}
        steps = steps / np.array([fractions[int(b)] for b in batches])
    for step in steps.tolist():  # summed in order, as one decode_step_cost after the other
        seconds += step
    return seconds


def _decode_step_seconds(model: PolicyModel, batch: int | np.ndarray, contexts: np.ndarray,
                         gpu: str | hardware.GpuSpec) -> np.ndarray:
    """``min_seconds(decode_step_cost(model.n_params_read, model.attention, b, c), gpu, "bf16")`` for each ``c``.

    ``batch`` is one batch for every step, or one per step. The same operations in the same order on an
    array of contexts (float64; the cache's bytes an exact integer, then rounded to float as the scalar
    sum rounds it), so each element equals the scalar call bit for bit (tests/rl/test_rlhf_cost.py): a
    response of 8,192 tokens costs a few array operations instead of 8,192 calls.
    """
    config, g, bytes_per_elem = model.attention, hardware.spec(gpu), 2
    attended = contexts if config.sliding_window is None else np.minimum(contexts, config.sliding_window)
    batches = np.broadcast_to(np.asarray(batch), attended.shape)
    flops = batches * (2.0 * model.n_params_read
                       + 4.0 * config.n_layers * config.n_heads * config.head_dim * attended)
    cache_per_token = 2 * bytes_per_elem * config.n_layers * config.n_kv_heads * config.head_dim
    cache = np.array([float(cache_per_token * b * tokens) for b, tokens in zip(batches.tolist(), attended.tolist())])
    nbytes = float(model.n_params_read) * bytes_per_elem + cache
    return np.maximum(flops / g.flops("bf16"), nbytes / g.hbm_bandwidth)


def _check_mfu(mfu: float) -> float:
    if not (check_positive("mfu", mfu) <= 1):
        raise ValueError(f"mfu must be in (0, 1], got {mfu!r}")
    return float(mfu)


def _check_parallel(n_gpus: int, tp: int) -> None:
    check_positive_int("n_gpus", n_gpus)
    check_positive_int("tp", tp)
    if n_gpus % tp:
        raise ValueError(f"n_gpus ({n_gpus}) must be a multiple of tp ({tp})")


def _check_flag(name: str, flag: object) -> bool:
    if not isinstance(flag, bool):
        raise ValueError(f"{name} must be True or False, got {flag!r}")
    return flag


def rlhf_step_time(algorithm: str, model: PolicyModel, n_prompts: int, group_size: int, prompt_len: int,
                   response_len: int, n_gpus: int = 8, tp: int = 1, gpu: str | hardware.GpuSpec = "H100-SXM",
                   mfu: float = 0.4, reference: bool = True, reward_model: bool = True, epochs: int = 1,
                   old_log_probs: bool = True,
                   weight_sync: bool = True, micro_batch_size: int = 4, mean_response_len: int | None = None,
                   bandwidth_bytes_per_s: float | None = None, generate: bool = True, trainer: str = "zero3",
                   trainer_pp: int = 1, optimizer_steps: int = 1, lengths: str = "longest",
                   decode_fraction: Callable[[int], float] | None = None, recompute: bool = False) -> StepTime:
    """Seconds of one step of ``algorithm`` for ``n_prompts`` prompts on ``n_gpus`` colocated GPUs (module docstring).

    PPO and GRPO generate ``group_size`` responses per prompt (PPO usually 1),
    recompute the old log-probs if ``old_log_probs``, score them (reference if
    ``reference``, reward model of the policy's size if ``reward_model`` (False:
    a rule-based reward), and for PPO the value model), train the policy (and
    PPO's value model) ``epochs`` times, and sync the weights if ``weight_sync``.
    Every phase runs on all ``n_gpus``, one after the other (colocated placement;
    :mod:`utils.rl.rollout_systems` times the others). Decoding runs
    ``response_len`` steps (the longest response) at the full batch with
    ``lengths="longest"``, or over :func:`response_lengths` with
    ``"exponential"`` (:func:`generation_seconds`, which also takes
    ``decode_fraction``); the later phases see ``mean_response_len`` tokens
    per response (default ``response_len``).
    ZeRO-3 gathers run per micro-batch of ``micro_batch_size`` sequences per GPU
    at ``bandwidth_bytes_per_s`` (default :func:`link_bandwidth`) when ``trainer`` is
    ``"zero3"``; a ``"megatron"`` trainer (TP ``tp``, PP ``trainer_pp``) instead
    synchronises gradients and parameters once per each of ``optimizer_steps``
    (the samples split into that many global batches). ``recompute`` (full
    activation checkpointing, Megatron's ``activation_checkpointing``) runs each
    trained forward twice: ``8 N`` FLOPs per token per pass instead of ``6 N``
    (Korthikanti et al. 2022, arXiv:2205.05198, section 5). DPO generates
    nothing: each prompt comes with a chosen and a rejected response
    (``group_size`` must be 2), reference log-probabilities precomputed.
    ``generate=False`` leaves generation (and ``tp``) to a separate rollout engine: 0 s here.
    """
    _check_algorithm(algorithm)
    for name, value in (("n_prompts", n_prompts), ("group_size", group_size), ("prompt_len", prompt_len),
                        ("response_len", response_len), ("epochs", epochs), ("micro_batch_size", micro_batch_size),
                        ("trainer_pp", trainer_pp), ("optimizer_steps", optimizer_steps)):
        check_positive_int(name, value)
    _check_parallel(n_gpus, tp)
    if trainer not in TRAINERS:
        raise ValueError(f"trainer must be one of {TRAINERS}, got {trainer!r}")
    if trainer == "megatron" and n_gpus % (tp * trainer_pp):
        raise ValueError(f"a Megatron trainer needs n_gpus ({n_gpus}) divisible by tp x trainer_pp ({tp} x {trainer_pp})")
    for name, flag in (("reference", reference), ("reward_model", reward_model), ("old_log_probs", old_log_probs),
                       ("weight_sync", weight_sync), ("generate", generate), ("recompute", recompute)):
        _check_flag(name, flag)
    if algorithm == "dpo" and group_size != 2:
        raise ValueError(f"DPO compares a chosen and a rejected response: group_size must be 2, got {group_size}")
    mean_len = response_len if mean_response_len is None else check_positive_int("mean_response_len",
                                                                                  mean_response_len)
    if mean_len > response_len:
        raise ValueError(f"mean_response_len ({mean_len}) cannot exceed response_len, the longest ({response_len})")
    _check_mfu(mfu)
    bandwidth = link_bandwidth(gpu, n_gpus) if bandwidth_bytes_per_s is None else check_positive(
        "bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    n = model.n_params
    sequences = n_prompts * group_size
    tokens = float(sequences) * (prompt_len + mean_len)
    peak = hardware.spec(gpu).flops("bf16") * mfu
    cluster_flops = peak * n_gpus
    # ZeRO-3, per micro-batch of one GPU: gather time of one forward (a third of a training step's volume)
    # against the compute it can hide behind
    per_gpu = math.ceil(sequences / n_gpus)
    micro = min(micro_batch_size, per_gpu)
    micro_batches = math.ceil(per_gpu / micro)
    gather = 2 * zero_communication_volume(n, 3, n_gpus) / 3 / bandwidth
    micro_tokens = micro * (prompt_len + mean_len)
    forward_compute = FORWARD_FLOPS_PER_PARAM_PER_TOKEN * n * micro_tokens / peak
    exposed_forward = micro_batches * max(0.0, gather - forward_compute)
    exposed_training = micro_batches * max(0.0, 3 * gather - 3 * forward_compute)
    if trainer == "megatron":
        dp = n_gpus // (tp * trainer_pp)
        exposed_forward = 0.0
        exposed_training = optimizer_steps * 2 * (2 * n / (tp * trainer_pp)) * (dp - 1) / dp / bandwidth
    per_pass = TRAINING_FLOPS_PER_PARAM_PER_TOKEN + (FORWARD_FLOPS_PER_PARAM_PER_TOKEN if recompute else 0)
    if algorithm == "dpo":
        return StepTime(0.0, 0.0, epochs * per_pass * n * tokens / cluster_flops,
                        communication=epochs * exposed_training)
    generation = generation_seconds(model, sequences, prompt_len, response_len, n_gpus, tp, gpu, mfu, lengths,
                                    mean_len, decode_fraction) if generate else 0.0
    scorers = int(reference) + int(reward_model) + int(algorithm == "ppo")
    forward = FORWARD_FLOPS_PER_PARAM_PER_TOKEN * n * tokens / cluster_flops
    trained = 2 if algorithm == "ppo" else 1
    training = epochs * trained * per_pass * n * tokens / cluster_flops
    communication = (scorers + int(old_log_probs)) * exposed_forward + epochs * trained * exposed_training
    sync = weight_sync_seconds(n, n_gpus, tp, bandwidth) if weight_sync else 0.0
    return StepTime(generation, scorers * forward, training, forward if old_log_probs else 0.0, communication, sync)
