"""Part 4's RLHF cost model against capstone 2's measured step: where one GRPO step's time goes.

Part 4's :func:`utils.rl.rlhf_cost.rlhf_step_time` splits a step into generation, old log-probs, scoring,
training and weight sync, from FLOPs and bytes at a GPU's peak rates. Here the same function prices the
step of :mod:`utils.capstone.async_rl` (16 prompts x 8 samples of part 4's arithmetic task, part 3's tiny
LLaMA in fp64) on a machine described by two measured rates instead of a datasheet
(:func:`measured_machine`):

- **FLOP/s**, fitted on one phase only, the measured training (``inner_epochs`` passes of ``6 N`` FLOPs per
  token, Kaplan et al. 2020), at ``mfu = 1``: the training row agrees by construction, and every other
  phase is a prediction;
- **bytes/s**, a measured copy of a large tensor (the decode steps' weight and KV-cache reads).

:func:`measured_split` reads the per-phase seconds of the synchronous two-process run (trainer rank and
engine rank take turns, so each phase is timed alone) and :func:`compare` puts the two side by side.
The model was written for GPUs running large models, where a decode step is bound by reading the
weights; on this CPU with a 76K-parameter model it is bound by the engine's fixed cost per step
(Python scheduling, block tables, one eager operator after another), which the model has no term for:
part 1's overheads chapter in another guise. :func:`engine_step_overhead` measures that cost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from utils.attention.kv_cache import AttentionConfig
from utils.attention.llama import TinyLlama
from utils.capstone.engine_rollouts import CONFIG, engine_rollouts, new_engine
from utils.capstone.grpo_engine import Settings, sample_seeds
from utils.gpu.hardware import GpuSpec
from utils.rl.rlhf_cost import PolicyModel, StepTime, rlhf_step_time
from utils.parallel.training import TRAINING_FLOPS_PER_PARAM_PER_TOKEN
from utils.rl.tiny_lm import MAX_RESPONSE, PROMPT_LEN, all_prompts
from utils.validate import check_positive

PHASES = ("generation", "log-probs", "training", "weight sync")
"""The step's phases as both sides name them; the model's ``old_log_probs`` and ``scoring`` (the reference's
forward; the reward is a rule) are the trainer's one ``log-probs`` phase."""


def tiny_policy() -> PolicyModel:
    """Capstone 2's policy (:data:`utils.capstone.engine_rollouts.CONFIG`) as the cost model describes a model:
    all parameters, those a decode step reads (all but the embedding table), attention and FFN sizes."""
    model_params = sum(p.numel() for p in TinyLlama(CONFIG).parameters())
    head_dim = CONFIG.dim // CONFIG.n_heads
    attention = AttentionConfig("capstone 2's tiny LLaMA", CONFIG.n_layers, CONFIG.dim, CONFIG.n_heads,
                                CONFIG.n_kv_heads, head_dim, "utils.capstone.engine_rollouts.CONFIG")
    return PolicyModel(attention.name, model_params, model_params - CONFIG.vocab * CONFIG.dim, attention,
                       CONFIG.ffn_hidden)


def measured_machine(flops_per_s: float, bytes_per_s: float, name: str = "this CPU") -> GpuSpec:
    """A :class:`~utils.gpu.hardware.GpuSpec` holding only what the cost model reads: a FLOP rate (given as the
    ``bf16`` peak the model asks for), a memory bandwidth and room for the weights. The SM fields are 0:
    nothing here reads them."""
    check_positive("flops_per_s", flops_per_s)
    check_positive("bytes_per_s", bytes_per_s)
    return GpuSpec(name=name, compute_capability="cpu", hbm_bytes=2 ** 40, hbm_bandwidth=float(bytes_per_s),
                   peak_flops={"bf16": float(flops_per_s)}, sm_count=0, l2_bytes=0, smem_per_sm_bytes=0,
                   smem_per_block_max_bytes=0, registers_per_sm=0, max_warps_per_sm=0, max_blocks_per_sm=0,
                   nvlink_bandwidth=0.0)


def measured_split(record: dict, mode: str = "sync") -> dict[str, float]:
    """Seconds per step of each phase in ``benchmarks/results/grpo_engine.json``'s two-process run ``mode``:
    generation on the engine rank, log-probs, training and the weight broadcast on the trainer rank."""
    if mode not in record["async"]:
        raise ValueError(f"mode must be one of {sorted(record['async'])}, got {mode!r}")
    run = record["async"][mode]
    steps = run["steps"]
    return {"generation": run["engine"]["generate"] / steps, "log-probs": run["trainer"]["log-probs"] / steps,
            "training": run["trainer"]["train"] / steps, "weight sync": run["trainer"]["send weights"] / steps}


def predicted_step(training_seconds: float, bytes_per_s: float, settings: Settings = Settings()) -> tuple[StepTime, float]:
    """``(step, flops_per_s)``: :func:`~utils.rl.rlhf_cost.rlhf_step_time` for capstone 2's GRPO step on one device,
    its FLOP rate fitted so that the training phase takes ``training_seconds``.

    The trainer runs the model over every padded row, ``PROMPT_LEN + MAX_RESPONSE`` tokens, so the model's
    response length is ``MAX_RESPONSE`` (its ``"longest"`` lengths); the reward is a rule, not a model; the
    weights stay on the one device (``n_gpus = 1``: the colocated sync moves nothing).
    """
    check_positive("training_seconds", training_seconds)
    policy = tiny_policy()
    sequences = settings.prompts_per_step * settings.group_size
    tokens = sequences * (PROMPT_LEN + MAX_RESPONSE)
    flops_per_s = settings.inner_epochs * TRAINING_FLOPS_PER_PARAM_PER_TOKEN * policy.n_params * tokens \
        / training_seconds
    step = rlhf_step_time("grpo", policy, settings.prompts_per_step, settings.group_size, PROMPT_LEN, MAX_RESPONSE,
                          n_gpus=1, gpu=measured_machine(flops_per_s, bytes_per_s), mfu=1.0, reward_model=False,
                          epochs=settings.inner_epochs, bandwidth_bytes_per_s=bytes_per_s)
    return step, flops_per_s


def as_phases(step: StepTime) -> dict[str, float]:
    """The model's :class:`~utils.rl.rlhf_cost.StepTime` in :data:`PHASES` (communication is 0 on one device)."""
    return {"generation": step.generation, "log-probs": step.old_log_probs + step.scoring,
            "training": step.training, "weight sync": step.weight_sync + step.communication}


@dataclass(frozen=True)
class Row:
    phase: str
    measured: float
    predicted: float

    @property
    def ratio(self) -> float:
        """Measured over predicted."""
        return self.measured / self.predicted if self.predicted else float("inf")


def compare(measured: dict[str, float], predicted: dict[str, float]) -> list[Row]:
    """One :class:`Row` per phase of :data:`PHASES`."""
    return [Row(p, measured[p], predicted[p]) for p in PHASES]


def copy_bandwidth(nbytes: int = 2 ** 27, repeats: int = 5) -> float:
    """Bytes/s of this machine's memory, from the fastest of ``repeats`` copies of ``nbytes`` (read + write)."""
    src = torch.empty(nbytes // 8, dtype=torch.float64).fill_(1.0)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * nbytes / best


@dataclass(frozen=True)
class StepCost:
    """Seconds per engine step of rollouts with ``requests`` requests, and the number of steps."""

    requests: int
    steps: int
    seconds_per_step: float


def engine_step_overhead(model: torch.nn.Module, prompts: int = 16, group_size: int = 8,
                         repeats: int = 3) -> tuple[StepCost, StepCost]:
    """The engine's seconds per step for one request alone and for ``prompts x group_size`` (the fastest of
    ``repeats`` rollouts each): if the two are close, a step's cost is fixed, not proportional to the work."""
    costs = []
    for n_prompts, g in ((1, 1), (prompts, group_size)):
        engine = new_engine(model, n_prompts * g)
        problems = all_prompts()[:n_prompts]
        best = None
        for r in range(repeats):
            engine.reset_prefix_cache()
            roll = engine_rollouts(engine, problems, g, sample_seeds(r, 0, n_prompts * g))
            cost = StepCost(n_prompts * g, roll.engine_steps, roll.seconds / roll.engine_steps)
            best = cost if best is None or cost.seconds_per_step < best.seconds_per_step else best
        costs.append(best)
    return costs[0], costs[1]
