"""Capstone 2: GRPO whose rollouts come from part 5's serving engine, on-policy or one step off-policy.

Each step (:func:`train`):

1. the engine samples ``G`` responses to each of ``prompts_per_step`` problems
   (:func:`~utils.capstone.engine_rollouts.engine_rollouts`, temperature 1), returning the tokens and the
   log-probs of the policy that sampled them, ``mu``;
2. the trainer scores them (part 4's verifiable reward), z-scores the rewards in each group, and computes
   the log-probs of its current policy ``pi_old`` (before the update) and of the reference;
3. ``inner_epochs`` Adam steps on :func:`tis_grpo_loss`;
4. the new weights go to the engine in place (:meth:`~utils.serving.runtime.engine.Engine.update_weights`),
   which also drops its prefix cache.

On-policy, ``mu = pi_old`` up to rounding. **One step off-policy** (``off_policy=True``), the engine samples
batch ``t + 1`` with the weights of step ``t`` while the trainer trains on batch ``t``, sampled with those of
step ``t - 1``: every batch after the first is one policy version stale, as in an asynchronous RL system
(the overlap itself is measured in :mod:`utils.capstone.async_rl`). Here the two are run one after the
other, which gives the same numbers. The loss then weights each token by the **truncated importance
ratio** ``w = min(pi_old / mu, C)`` (truncated importance sampling, Yao et al. 2025, "Your Efficient RL
Framework Secretly Brings You Off-Policy RL Training"; part 4's chapter 8, section 3.4), so that the
gradient is again one of ``pi_old``'s expected surrogate, with bounded variance.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from utils.capstone.engine_rollouts import engine_rollouts, new_engine, pretrained_llama
from utils.rl.objectives import grpo_advantages, kl_estimate
from utils.rl.post_training import arithmetic_reward, frozen_copy
from utils.rl.tiny_lm import all_prompts, response_mask, token_logprobs
from utils.validate import check_positive, check_positive_int

EVAL_SAMPLES = 4
"""Samples per problem when the accuracy is measured (all 100 problems, temperature 1)."""


def tis_grpo_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, logp_ref: torch.Tensor,
                  logp_behaviour: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, clip: float = 0.2,
                  beta: float = 0.04, cap: float = 2.0) -> torch.Tensor:
    """GRPO's token-mean loss (part 4's ``grpo_loss``, ``"bnpo"``) with each token's clipped surrogate weighted
    by ``w = min(exp(logp_old - logp_behaviour), cap)``, held constant:

    ``mean_tokens[ -w min(r A, clip(r, 1 +- eps) A) + beta k3(pi, pi_ref) ]``, ``r = exp(logp_new - logp_old)``.

    With ``logp_behaviour = logp_old`` (on-policy, no mismatch) ``w = 1`` and this is part 4's loss.
    """
    check_positive("cap", cap)
    mask = mask.bool()
    w = torch.exp(logp_old - logp_behaviour).clamp(max=cap).detach()
    ratio = torch.exp(logp_new - logp_old)
    adv = advantages[:, None].to(ratio.dtype).expand_as(ratio)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    per_token = -w * surrogate + beta * kl_estimate(logp_new, logp_ref, "k3")
    return per_token[mask].mean()


@dataclass(frozen=True)
class Settings:
    steps: int = 30
    prompts_per_step: int = 16
    group_size: int = 8
    lr: float = 3e-3
    beta: float = 0.04
    clip: float = 0.2
    inner_epochs: int = 2
    cap: float = 2.0
    eval_every: int = 10

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "group_size", "inner_epochs", "eval_every"):
            check_positive_int(name, getattr(self, name))
        for name in ("lr", "cap"):
            check_positive(name, getattr(self, name))


@dataclass
class History:
    """Per step: the batch's reward and importance ratios; every ``eval_every`` steps, the accuracy."""

    reward: list[float] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)
    """Policy versions between the weights that sampled the batch and the weights it trains."""
    ratio_mean: list[float] = field(default_factory=list)
    ratio_max: list[float] = field(default_factory=list)
    truncated: list[float] = field(default_factory=list)
    """Share of response tokens whose ratio ``pi_old / mu`` exceeded the cap."""
    hit_rate: list[float] = field(default_factory=list)
    sync_bytes: list[int] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)


def sample_seeds(seed: int, step: int, n: int) -> list[int]:
    """Distinct sampling seeds for the ``n`` requests of a step (and for evaluation, ``step = -1 - k``)."""
    base = (seed * 1_000_003 + (step + 7) * 10_007) % (2 ** 31)
    return [base + i for i in range(n)]


def accuracy(engine, seed: int, k: int) -> float:
    """The mean reward of ``EVAL_SAMPLES`` temperature-1 samples of each of the 100 problems, on ``engine``."""
    problems = all_prompts()
    roll = engine_rollouts(engine, problems, EVAL_SAMPLES, sample_seeds(seed, -1 - k, len(problems) * EVAL_SAMPLES))
    return arithmetic_reward(roll.sequences).mean().item()


def train(seed: int = 0, off_policy: bool = False, settings: Settings = Settings()) -> tuple[torch.nn.Module, History]:
    """GRPO from :func:`~utils.capstone.engine_rollouts.pretrained_llama` with the engine's rollouts; returns the
    trained policy and its :class:`History`. ``seed`` picks the problems and the samples."""
    s = settings
    base, _ = pretrained_llama()
    policy, ref = copy.deepcopy(base).train(), frozen_copy(base)
    served = copy.deepcopy(base)
    n = s.prompts_per_step * s.group_size
    engine = new_engine(served, max(n, 100 * EVAL_SAMPLES))
    opt = torch.optim.Adam(policy.parameters(), lr=s.lr)
    g = torch.Generator().manual_seed(seed)
    history = History()

    def rollouts(step: int):
        picks = torch.randint(100, (s.prompts_per_step,), generator=g).tolist()
        return engine_rollouts(engine, [all_prompts()[i] for i in picks], s.group_size, sample_seeds(seed, step, n))

    pending = rollouts(0) if off_policy else None
    for step in range(s.steps):
        if step % s.eval_every == 0:
            history.eval_step.append(step)
            history.accuracy.append(accuracy(engine, seed, step))
        if off_policy:
            batch, stale = pending, int(step > 0)
            if step + 1 < s.steps:
                pending = rollouts(step + 1)  # sampled with this step's weights, trained on next step
        else:
            batch, stale = rollouts(step), 0
        seq, mask = batch.sequences, response_mask(batch.sequences)
        rewards = arithmetic_reward(seq).double()
        advantages = grpo_advantages(rewards, s.group_size)
        with torch.no_grad():
            logp_old, logp_ref = token_logprobs(policy, seq), token_logprobs(ref, seq)
        ratio = torch.exp(logp_old - batch.logprobs)[mask]
        history.reward.append(rewards.mean().item())
        history.staleness.append(stale)
        history.ratio_mean.append(ratio.mean().item())
        history.ratio_max.append(ratio.max().item())
        history.truncated.append((ratio > s.cap).double().mean().item())
        history.hit_rate.append(batch.hit_rate)
        for _ in range(s.inner_epochs):
            loss = tis_grpo_loss(token_logprobs(policy, seq), logp_old, logp_ref, batch.logprobs, advantages, mask,
                                 s.clip, s.beta, s.cap)
            opt.zero_grad()
            loss.backward()
            opt.step()
        history.sync_bytes.append(engine.update_weights(policy.named_parameters()))
    history.eval_step.append(s.steps)
    history.accuracy.append(accuracy(engine, seed, s.steps))
    return policy, history
