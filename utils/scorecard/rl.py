"""Scorecard rows of the RLHF cost model (part 4, chapter 8): ``rlhf_cost`` and ``rlhf_flop_share``.

``rlhf_cost``: :func:`utils.rl.rlhf_cost.rlhf_step_time` (colocated, on
policy) and :func:`utils.rl.rollout_systems.step_timeline` (one-step
off-policy, generation on its own GPUs) against NeMo RL's published GRPO step
times for Llama 3.1 8B on DGX-H100, the one model of those tables the cost
model offers. The recipe files give the batch (64 prompts x 32 samples), the
longest sequence (4,096 tokens), the micro-batch (1) and the GPU split; the
table gives the mean sequence length, the training batch (T-GBS 512, so four
optimizer steps per RL step) and the trainer: Megatron-core; the recipes give
its pipeline stages (:data:`ROWS`) and full activation checkpointing. The
rollouts are priced as vLLM would decode them: response lengths of the
published mean (an assumed censored exponential, capped at the longest
allowed), each decode step at the fraction of the roof that the serving
scorecard's fit rows give (:mod:`utils.serving.costs.calibrated`; nothing
was fitted on these rows, so they stay holdout). The prompt length is not published:
every row assumes :data:`PROMPT_LEN` (any value from 64 to 512 moves the
predictions by under 1%).

``rlhf_flop_share``: chapter 8's check of DeepSpeed-Chat's "approximately
20%" of the computation in generation, counted with the book's FLOPs per
parameter per token.
"""

from __future__ import annotations

from functools import partial

from utils.parallel import training as _training
from utils.rl import rlhf_cost as _rlhf
from utils.rl import rollout_systems as _rollout
from utils.scorecard.record import Entry
from utils.serving.costs import calibrated as _calibrated

NEMO_RL = "NVIDIA-NeMo/RL, docs/about/performance-summary.md"
NEMO_RL_VERSIONS = {
    "v0.4": f"{NEMO_RL} at commit cff17f83 ('Nemo RL v0.4', DGX-H100, training and generation BF16); recipes "
            "examples/configs/recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g*.yaml at tag v0.4.0",
    "v0.5": f"{NEMO_RL} at commit 108bffda ('Nemo RL v0.5', DGX-H100, training and generation BF16); recipes "
            "examples/configs/recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g*.yaml at tag v0.5.0",
    "v0.5 FP8": f"{NEMO_RL} at commit 108bffda ('Nemo RL v0.5', 'H100 FP8 Benchmarks': generation FP8, training "
                "FP8); recipe examples/configs/recipes/llm/performance/grpo-llama3.1-8b-instruct-2n8g-fp8-async-1off"
                ".yaml at tag v0.5.0 (fp8 'e4m3', 'blockwise')",
}
PROMPT_LEN = 128
"""Tokens per prompt (an OpenMathInstruct-2 problem in the chat template): assumed, not published."""
MAX_SEQ = 4096
ROWS = (  # version, policy, mean sequence length (prompt + response), published step seconds, trainer PP
    ("v0.4", "on", 1060, 97.7, 2), ("v0.4", "off", 1129, 74.6, 2), ("v0.5", "on", 1019, 92.8, 2),
    ("v0.5", "off", 1123, 64.8, 1), ("v0.5 FP8", "off", 1128, 53.0, 1))
"""The trainer's pipeline stages are the recipes' ``pipeline_model_parallel_size`` (2 in the on-policy recipe, which
v0.4's async recipe inherits; v0.5's async recipe sets 1). Every recipe inherits ``activation_checkpointing: true``."""
DEEPSPEED_CHAT = ("microsoft/DeepSpeed, blogs/deepspeed-chat/README.md at commit 040679e5, 'Effective Throughput "
                  "Analysis': 'the generation phase comprises approximately 20% of the total computation'")

TRAIN_GLOBAL_BATCH = 512
"""T-GBS: sequences per optimizer step, so the 64 x 32 = 2,048 samples (G-GBS) make 4 optimizer steps."""

_OMITS = ("response lengths assumed a censored exponential of the published mean (the step ends with the longest); "
          "training at 0.4 MFU with no optimizer step or logits work; the Megatron trainer's gradient and "
          "parameter syncs charged in full, its pipeline bubble left out; refit from one rank")


def _decode_fraction(batch: int) -> float:
    """The serving scorecard's calibrated fraction of the roof a decode step reaches (looked up when called)."""
    return _calibrated.decode_fraction(batch, _calibrated.ACHIEVED)


def _step_kwargs(mean_len: int, trainer_pp: int = 2) -> dict[str, object]:
    return dict(reward_model=False, reference=True, old_log_probs=True, epochs=1, micro_batch_size=1,
                mean_response_len=mean_len - PROMPT_LEN, trainer="megatron", trainer_pp=trainer_pp,
                optimizer_steps=64 * 32 // TRAIN_GLOBAL_BATCH, lengths="exponential", decode_fraction=_decode_fraction,
                recompute=True)


def on_policy_seconds(mean_len: int, trainer_pp: int = 2) -> float:
    """The colocated step: 64 prompts x 32 samples on 16 H100s, rule-based reward, the reference's KL."""
    model = _rlhf.policy_model("Llama-3-8B")
    return _rlhf.rlhf_step_time("grpo", model, 64, 32, PROMPT_LEN, MAX_SEQ - PROMPT_LEN, n_gpus=16, tp=1,
                                **_step_kwargs(mean_len, trainer_pp)).total


def one_step_off_seconds(mean_len: int, trainer_pp: int = 2) -> float:
    """The async step: generation on 8 H100s, training on the other 8, one policy version stale."""
    model = _rlhf.policy_model("Llama-3-8B")
    segments = _rollout.step_timeline("async", "grpo", model, 64, 32, PROMPT_LEN, MAX_SEQ - PROMPT_LEN, n_gpus=16,
                                      tp=1, n_rollout_gpus=8, n_steps=3, **_step_kwargs(mean_len, trainer_pp))
    return _rollout.steady_step_seconds(segments)


def generation_flop_share() -> float:
    """Generation's share of a PPO step's FLOPs with a small reward model and critic: ``F / (F + 2F + T)``."""
    forward, train = _training.FORWARD_FLOPS_PER_PARAM_PER_TOKEN, _training.TRAINING_FLOPS_PER_PARAM_PER_TOKEN
    return forward / (forward + 2 * forward + train)


def entries() -> list[Entry]:
    """Five NeMo RL GRPO steps and DeepSpeed-Chat's compute share."""
    out = []
    for version, policy, mean_len, seconds, trainer_pp in ROWS:
        on, fp8 = policy == "on", version.endswith("FP8")
        omits = _OMITS + ("" if on else "; in-flight weight updates (the planner waits for a full sync)")
        if fp8:
            omits += "; FP8 generation and FP8 training, which the model cannot express (it prices both in BF16)"
        out.append(Entry(
            "rlhf_cost", f"NeMo RL {version} GRPO, Llama 3.1 8B, 16 H100, {'on policy' if on else '1-step off policy'}",
            NEMO_RL_VERSIONS[version] + ("" if on else " (-async-1off: generation on 1 node of 8, not colocated)"),
            {"model": "Llama-3-8B", "n_gpus": 16, "n_prompts": 64, "group_size": 32, "max_seq_len": MAX_SEQ,
             "mean_seq_len": mean_len, "prompt_len": f"{PROMPT_LEN} (assumed)", "micro_batch": 1, "tp": 1,
             "placement": "colocated" if on else "async, 8 rollout + 8 trainer GPUs",
             "trainer": f"Megatron-core, TP 1, PP {trainer_pp}, activation checkpointing",
             "train_global_batch": TRAIN_GLOBAL_BATCH, "precision": "FP8" if fp8 else "BF16"},
            "GRPO step time", "s", seconds, partial(on_policy_seconds if on else one_step_off_seconds, mean_len,
                                                     trainer_pp),
            "holdout", omits))
    out.append(Entry("rlhf_flop_share", "DeepSpeed-Chat step 3 (PPO), 256 + 256 tokens, small reward model and critic",
                     DEEPSPEED_CHAT, {"prompt_len": 256, "response_len": 256, "epochs": 1,
                                      "reward_and_critic": "negligible next to the actor"},
                     "generation's share of the step's FLOPs", "fraction", 0.20, generation_flop_share, "holdout",
                     "'approximately 20%' is the blog's rounding; the count is one forward of the actor (2N per "
                     "token) against its log-probs, the reference and its training pass (2N + 2N + 6N): 2/12"))
    return out
