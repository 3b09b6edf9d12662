"""PPO in full: the critic's (clipped) value loss, the entropy bonus, eq. 9's total, and the KL controls.

Schulman et al. 2017 ("Proximal Policy Optimization Algorithms", arXiv:1707.06347):

- eq. 9: ``L^{CLIP+VF+S} = E_t[L^CLIP_t - c1 L^VF_t + c2 S[pi](s_t)]``, maximised,
  with ``L^VF_t = (V(s_t) - V^targ_t)^2`` and ``S`` the policy's entropy.
  :func:`ppo_loss` returns its negation (a loss to minimise) and its parts;
  the policy term is :func:`utils.rl.objectives.ppo_clip_loss` (eq. 7).
- section 4, PPO-Penalty: ``L^KLPEN = E_t[rho_t A_t - beta KL[pi_old(.|s_t), pi(.|s_t)]]``
  with ``beta`` adapted after each update (:class:`AdaptiveKLController`).

The critic's targets are ``V^targ = A^GAE + V_old`` (the lambda-return), and its
loss is clipped around the old values as in OpenAI baselines' ``ppo2`` and TRL's
``PPOTrainer`` (``cliprange_value``, ``trl/experimental/ppo/ppo_trainer.py`` at
commit ``f2cd577``): :func:`ppo_value_loss`. Early stopping of the inner epochs on
the approximate KL follows Spinning Up's PPO (Achiam 2018, ``target_kl``):
:func:`approx_kl` and :func:`should_stop_early`.

For a batch of LLM responses, :func:`token_rewards` spreads eq. 2 of InstructGPT
(Ouyang et al. 2022) over the tokens and :func:`masked_gae` computes GAE per
response with padding (labs/04-rl/06).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from utils.rl.objectives import _same_shape, kl_estimate, ppo_clip_loss
from utils.validate import check_nonnegative, check_positive


def _masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return x.mean()
    if mask.shape != x.shape:
        raise ValueError(f"mask must have the shape {tuple(x.shape)}, got {tuple(mask.shape)}")
    mask = mask.to(x.dtype)
    if mask.sum() == 0:
        raise ValueError("mask selects no element; at least one must be 1")
    return (x * mask).sum() / mask.sum()


def value_targets(advantages: torch.Tensor, old_values: torch.Tensor) -> torch.Tensor:
    """``V^targ_t = A_t + V_old(s_t)``: with GAE advantages, the lambda-return the critic regresses on.

    As TRL's ``returns = advantages + values`` and baselines' ``ppo2``
    (``mb_returns = mb_advs + mb_values``). With ``lambda = 1`` it is the
    discounted return ``G_t``; with ``lambda = 0`` the one-step TD target
    ``r_t + gamma V_old(s_{t+1})``.
    """
    _same_shape(advantages=advantages, old_values=old_values)
    return advantages + old_values


def ppo_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                   clip: float | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The critic's loss ``1/2 mean((V - V^targ)^2)``, or its clipped form when ``clip`` is given.

    Clipped (OpenAI baselines ``ppo2``; TRL ``cliprange_value``, default 0.2):
    ``V_clip = old_values + clamp(V - old_values, -clip, clip)`` and the loss is
    ``1/2 mean(max((V - R)^2, (V_clip - R)^2))``: the pessimistic choice, as in
    eq. 7, so a value that moved more than ``clip`` away from ``old_values`` gets
    no gradient when moving further would have helped. The factor 1/2 is
    baselines' and TRL's; eq. 9 writes ``(V - V^targ)^2`` and folds it into ``c1``.
    ``mask`` (same shape, 0/1) averages over the real tokens only.
    """
    _same_shape(values=values, old_values=old_values, returns=returns)
    unclipped = (values - returns) ** 2
    if clip is None:
        return 0.5 * _masked_mean(unclipped, mask)
    check_nonnegative("clip", clip)
    clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
    return 0.5 * _masked_mean(torch.maximum(unclipped, (clipped_values - returns) ** 2), mask)


def entropy_bonus(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean entropy ``H = -sum_a pi(a) log pi(a)`` of the softmax over the last dimension, in nats.

    Computed as ``logsumexp(l) - sum_a softmax(l)_a l_a`` (TRL's formula); a
    uniform distribution over ``V`` outcomes gives ``log V``. ``mask`` has the
    shape ``logits.shape[:-1]`` (one 0/1 per token).
    """
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits need a last (vocabulary) dimension of size >= 1, got {tuple(logits.shape)}")
    entropy = torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)
    return _masked_mean(entropy, mask)


class PPOLoss(NamedTuple):
    """Eq. 9 negated: ``total = policy + vf_coef * value - ent_coef * entropy``, and its three parts."""

    total: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor


def ppo_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
             values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
             logits: torch.Tensor | None = None, clip: float = 0.2, clip_value: float | None = None,
             vf_coef: float = 0.5, ent_coef: float = 0.0) -> PPOLoss:
    """``-(L^CLIP - c1 L^VF + c2 S)``, Schulman et al. 2017, eq. 9, with ``c1 = vf_coef``, ``c2 = ent_coef``.

    ``policy`` is :func:`ppo_clip_loss` (``-L^CLIP``), ``value`` is
    :func:`ppo_value_loss` (clipped when ``clip_value`` is given) and ``entropy``
    is :func:`entropy_bonus` of ``logits`` (zero when ``logits`` is None, which
    requires ``ent_coef = 0``). Defaults: ``c1 = 0.5`` as baselines' ``ppo2``;
    the paper's Atari runs use ``c1 = 1, c2 = 0.01`` (table 5); TRL uses
    ``vf_coef = 0.1`` and no entropy term in the loss.
    """
    check_nonnegative("vf_coef", vf_coef)
    check_nonnegative("ent_coef", ent_coef)
    if logits is None and ent_coef:
        raise ValueError(f"ent_coef = {ent_coef} needs the policy's logits; pass logits or set ent_coef = 0")
    policy = ppo_clip_loss(logp_new, logp_old, advantages, clip)
    value = ppo_value_loss(values, old_values, returns, clip_value)
    entropy = entropy_bonus(logits) if logits is not None else torch.zeros((), dtype=policy.dtype)
    return PPOLoss(policy + vf_coef * value - ent_coef * entropy, policy, value, entropy)


def ppo_penalty_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                     kl: torch.Tensor, beta: float) -> torch.Tensor:
    """``-mean(rho A - beta KL)``: PPO-Penalty's surrogate (Schulman et al. 2017, section 4, eq. 8).

    ``kl`` holds ``KL[pi_old(.|s_t), pi(.|s_t)]`` per sample, computed by the
    caller from the two distributions (it must carry the gradient of ``pi``).
    """
    _same_shape(logp_new=logp_new, logp_old=logp_old, advantages=advantages, kl=kl)
    check_nonnegative("beta", beta)
    return -(torch.exp(logp_new - logp_old) * advantages - beta * kl).mean()


class AdaptiveKLController:
    """PPO-Penalty's coefficient rule (Schulman et al. 2017, section 4).

    After each policy update, with ``d`` the measured mean
    ``KL[pi_old, pi]``: if ``d < d_targ / 1.5`` then ``beta <- beta / 2``; if
    ``d > 1.5 d_targ`` then ``beta <- 2 beta``; otherwise ``beta`` stays. The
    paper notes that 1.5 and 2 are heuristic and the result is not sensitive to them.
    """

    def __init__(self, beta: float, target: float, tolerance: float = 1.5, factor: float = 2.0):
        self.beta = check_positive("beta", beta, finite=True)
        self.target = check_positive("target", target, finite=True)
        if tolerance <= 1 or factor <= 1:
            raise ValueError(f"tolerance and factor must exceed 1, got {tolerance!r} and {factor!r}")
        self.tolerance, self.factor = float(tolerance), float(factor)

    def update(self, kl: float) -> float:
        """Adapt ``beta`` to the KL ``kl`` measured after an update, and return the new ``beta``."""
        kl = check_nonnegative("kl", float(kl), finite=True)
        if kl < self.target / self.tolerance:
            self.beta /= self.factor
        elif kl > self.target * self.tolerance:
            self.beta *= self.factor
        return self.beta


def approx_kl(logp_new: torch.Tensor, logp_old: torch.Tensor) -> torch.Tensor:
    """``mean(logp_old - logp_new)`` on samples from ``pi_old``: Spinning Up's estimate of ``KL[pi_old, pi]``.

    Each term is Schulman's k1 with the roles of the two policies set by the
    sampler: unbiased for ``KL(pi_old || pi)`` because the actions came from ``pi_old``.
    """
    return kl_estimate(logp_old, logp_new, "k1").mean()  # k1 = -log(pi / pi_old), the sampler pi_old


def should_stop_early(kl: float, target_kl: float, margin: float = 1.5) -> bool:
    """Spinning Up's rule: stop this batch's policy updates once ``approx_kl > margin * target_kl``.

    Spinning Up's PPO defaults to ``target_kl = 0.01`` and checks before each
    gradient step (``if kl > 1.5 * target_kl: break``).
    """
    check_positive("target_kl", target_kl)
    check_positive("margin", margin)
    return float(kl) > margin * target_kl


def token_rewards(logp: torch.Tensor, logp_ref: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor,
                  beta: float) -> torch.Tensor:
    """``(batch, T)`` per-token rewards of RLHF's PPO: ``-beta (log pi - log pi_ref)`` on every real token,
    plus the sequence's score on its last real token (InstructGPT section 3.5, "a per-token KL penalty";
    TRL's ``rewards[actual_end] += scores``). Padding gets 0.

    Their sum over a response is ``score - beta log(pi(y|x) / pi_ref(y|x))``, eq. 2's objective.
    """
    _same_shape(logp=logp, logp_ref=logp_ref, mask=mask)
    check_nonnegative("beta", beta)
    mask = mask.bool()
    if scores.shape != (logp.shape[0],) or not mask.any(1).all():
        raise ValueError(f"scores must be ({logp.shape[0]},) and every row of mask needs a real token, "
                         f"got scores {tuple(scores.shape)}")
    rewards = torch.where(mask, -beta * (logp - logp_ref), torch.zeros_like(logp))
    last = mask.long().sum(1) - 1
    if not torch.equal(mask, torch.arange(mask.shape[1]) <= last[:, None]):
        raise ValueError("mask must mark a prefix of each row (the response's tokens, then padding)")
    rewards[torch.arange(len(rewards)), last] += scores.to(rewards.dtype)
    return rewards


def masked_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
               lam: float = 0.95) -> torch.Tensor:
    """GAE (Schulman et al. 2016, eq. 16) of a batch of responses, each ending at its last real token.

    ``rewards``, ``values`` and ``mask`` are ``(batch, T)``; ``values[:, t]`` is
    ``V`` before token ``t``. Row by row it equals :func:`utils.rl.objectives.gae`
    of the real tokens with ``V = 0`` after the last one (the episode ended);
    padding gets 0.
    """
    _same_shape(rewards=rewards, values=values, mask=mask)
    for name, value in (("gamma", gamma), ("lam", lam)):
        if not 0 <= value <= 1:
            raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    m = mask.to(rewards.dtype)
    advantages = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    next_value = torch.zeros_like(running)
    for t in range(rewards.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * m[:, t]
        next_value = values[:, t] * m[:, t]
        advantages[:, t] = running
    return advantages
