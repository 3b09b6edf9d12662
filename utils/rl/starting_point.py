"""The post-training labs' starting points: the pre-trained, SFT and GRPO arithmetic models, each trained once.

Lab 03 pre-trains :class:`~utils.rl.tiny_lm.TinyLM` on the noisy corpus and fine-tunes a LoRA on
clean demonstrations; labs 04 (GRPO) and 05 (DPO) start from that same SFT model, and lab 06 (PPO)
from the pre-trained one. Lab 04 trains the SFT model with GRPO and lab 05 compares DPO with that
same GRPO policy. The functions here run the labs' recipe, exactly as the labs print it, under
:func:`utils.train_once.train_once`: the first page (or test) that asks trains, the others load
the stored result, bitwise the same on the same machine and code.
"""

from __future__ import annotations

import copy

from utils.rl.lora import apply_lora
from utils.rl.post_training import frozen_copy, train_grpo
from utils.rl.tiny_lm import TinyLM, all_prompts, arithmetic_corpus, train_lm
from utils.train_once import train_once

__all__ = ["LORA_TARGETS", "grpo_lm", "pretrained_lm", "sft_lm"]

LORA_TARGETS = ("q", "v", "o", "up", "down")
"""The projections of :class:`~utils.rl.tiny_lm.TinyLM` the labs adapt with LoRA."""


@train_once
def pretrained_lm(n_sequences: int = 20_000, noise: float = 0.5, steps: int = 600, lr: float = 3e-3,
                  batch_size: int = 128, seed: int = 0) -> tuple[TinyLM, list[float]]:
    """``(model, losses)``: ``TinyLM(seed=seed)`` after ``train_lm`` on ``arithmetic_corpus(n_sequences, noise, seed)``.

    Pre-training: next-token cross-entropy on every token, ``steps`` AdamW steps of
    ``batch_size`` sequences; ``losses`` holds each step's loss.
    """
    model = TinyLM(seed=seed)
    losses = train_lm(model, arithmetic_corpus(n_sequences, noise=noise, seed=seed), steps=steps, lr=lr,
                      batch_size=batch_size, seed=seed, desc="pre-train")
    return model, losses


@train_once
def sft_lm(rank: int = 4, alpha: float = 8.0, targets: tuple[str, ...] = LORA_TARGETS, n_demonstrations: int = 2000,
           steps: int = 100, lr: float = 1e-3, batch_size: int = 64, seed: int = 1) -> tuple[TinyLM, TinyLM]:
    """``(base, sft)``: :func:`pretrained_lm`'s model, and a copy with a LoRA trained on clean demonstrations.

    SFT: ``apply_lora(copy.deepcopy(base), rank, alpha, targets)``, then ``train_lm`` with the
    response-only loss on ``arithmetic_corpus(n_demonstrations, noise=0.0, seed=seed)`` of the
    ``TRAIN`` half of the problems (``all_prompts()[::2]``). LoRA's ``A`` matrices are drawn from
    torch's global generator where ``TinyLM(seed=0)``'s initialisation leaves it, as in the labs'
    recipe (pre-train, then adapt) and in ``benchmarks/post_training_frontier.sft_model(0)``: this
    is the frontier's seed-0 SFT model, the one labs 04 and 05 quote and plot.
    """
    base, _ = pretrained_lm()
    TinyLM(seed=0)  # seeds torch's generator and draws a TinyLM's initial weights: the state the recipe adapts in
    sft = apply_lora(copy.deepcopy(base), rank=rank, alpha=alpha, targets=targets)
    train_lm(sft, arithmetic_corpus(n_demonstrations, noise=0.0, seed=seed, problems=all_prompts()[::2]),
             steps=steps, lr=lr, batch_size=batch_size, response_only=True, seed=seed, desc="SFT")
    return base, sft


@train_once
def grpo_lm(steps: int = 100, prompts_per_step: int = 16, group_size: int = 8, lr: float = 3e-3, beta: float = 0.04,
            clip: float = 0.2, inner_epochs: int = 2, seed: int = 0) -> tuple[TinyLM, dict[str, list[float]]]:
    """``(policy, history)``: a copy of :func:`sft_lm`'s SFT model after :func:`~utils.rl.post_training.train_grpo`.

    GRPO on all 100 problems (``all_prompts()``), the reference ``frozen_copy`` of the SFT model;
    ``history`` is what ``train_grpo`` returns (per-step reward and KL, ...).
    """
    _, sft = sft_lm()
    policy = copy.deepcopy(sft)
    history = train_grpo(policy, frozen_copy(sft), all_prompts(), steps=steps, prompts_per_step=prompts_per_step,
                         group_size=group_size, lr=lr, beta=beta, clip=clip, inner_epochs=inner_epochs, seed=seed)
    return policy, history
