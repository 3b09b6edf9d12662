"""The losses of LLM post-training: Bradley-Terry reward models, PPO's clipped surrogate, GRPO, DPO.

Each takes log-probabilities of whole responses (or tokens) as torch tensors
and returns a scalar to minimise:

- Bradley-Terry (Bradley & Terry 1952; Ouyang et al. 2022, eq. 1): the chosen
  response beats the rejected one with probability ``sigmoid(r_c - r_r)``; the
  loss is ``-log sigmoid(r_c - r_r)``, averaged.
- PPO (Schulman et al. 2017, arXiv:1707.06347, eq. 7): with the ratio
  ``rho = exp(logp_new - logp_old)`` and advantages ``A``, maximise
  ``min(rho A, clip(rho, 1 - eps, 1 + eps) A)``; :func:`ppo_clip_loss` returns its negated mean.
- GRPO (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, section 4.1.2):
  sample a group of G responses per prompt and use each reward's z-score within
  its group as the advantage, with no value model.
- DPO (Rafailov et al. 2023, arXiv:2305.18290, eq. 7):
  ``-log sigmoid(beta [(log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))])``, averaged.
- Schulman's KL estimators k1, k2, k3 ("Approximating KL divergence", 2020):
  :func:`kl_estimate`. Their *values* are about ``KL(pi || pi_ref)`` on samples
  from ``pi``; their *gradients*, when used as a loss, are a different matter
  (Tang & Munos 2025, arXiv:2506.09477; Liu et al. 2025, arXiv:2510.01555).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from utils.validate import check_nonnegative, check_positive, check_positive_int

GRPO_EPS = 1e-6
"""Added to the group standard deviation so that a group of equal rewards gives zero advantages."""


def _same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"inputs must have the same shape, got {shapes}")


def bradley_terry_loss(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> torch.Tensor:
    """``mean(-log sigmoid(r_chosen - r_rejected))``: the reward model's loss on preference pairs."""
    _same_shape(chosen_rewards=chosen_rewards, rejected_rewards=rejected_rewards)
    return -F.logsigmoid(chosen_rewards - rejected_rewards).mean()


def ppo_clip_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                  clip: float = 0.2) -> torch.Tensor:
    """``-mean(min(rho A, clip(rho, 1 - clip, 1 + clip) A))`` with ``rho = exp(logp_new - logp_old)``."""
    _same_shape(logp_new=logp_new, logp_old=logp_old, advantages=advantages)
    check_nonnegative("clip", clip)
    ratio = torch.exp(logp_new - logp_old)
    surrogate = torch.minimum(ratio * advantages, torch.clamp(ratio, 1 - clip, 1 + clip) * advantages)
    return -surrogate.mean()


def grpo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Each reward's z-score within its group: ``(r - mean_group) / (std_group + eps)``.

    ``rewards`` is 1-D with consecutive groups of ``group_size`` responses to
    the same prompt. The standard deviation is the unbiased one, as in TRL's
    GRPO trainer; a group of equal rewards gives zeros.
    """
    check_positive_int("group_size", group_size)
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a length that is a multiple of group_size ({group_size}), "
                         f"got shape {tuple(rewards.shape)}")
    groups = rewards.reshape(-1, group_size).to(torch.float64 if rewards.dtype == torch.float64 else torch.float32)
    std = groups.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(groups[:, :1])
    return ((groups - groups.mean(dim=1, keepdim=True)) / (std + GRPO_EPS)).reshape(-1)


def dpo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
             ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor, beta: float = 0.1) -> torch.Tensor:
    """The mean DPO loss, ``-log sigmoid(beta (chosen log-ratio - rejected log-ratio))`` (Rafailov et al. 2023)."""
    _same_shape(policy_chosen_logps=policy_chosen_logps, policy_rejected_logps=policy_rejected_logps,
                ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    check_positive("beta", beta)
    margin = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
    return -F.logsigmoid(beta * margin).mean()


KL_ESTIMATORS = ("k1", "k2", "k3")
"""The names :func:`kl_estimate` accepts."""


def kl_estimate(logp: torch.Tensor, logp_ref: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Schulman's single-sample estimators of ``KL(pi || pi_ref)``, elementwise, for samples ``x ~ pi``.

    With ``log r = logp_ref - logp`` (Schulman 2020, "Approximating KL divergence"):

    - ``k1 = -log r``: unbiased, but negative on about half the samples, so noisy;
    - ``k2 = (log r)^2 / 2``: non-negative, biased (its mean is an f-divergence
      that agrees with KL to second order);
    - ``k3 = (r - 1) - log r``: unbiased and non-negative (``log r <= r - 1``),
      the estimator of DeepSeekMath's eq. 4 (arXiv:2402.03300).

    "Unbiased" holds for the *value* and only on samples from ``pi`` itself.
    Used as a loss and differentiated, the gradients are (taking the
    expectation over ``x ~ pi`` with the sampling held fixed):
    ``E[grad k1] = 0``, ``E[grad k2] = grad KL(pi || pi_ref)`` and
    ``E[grad k3] = grad KL(pi_ref || pi)``, the *forward* KL
    (Tang & Munos 2025, arXiv:2506.09477; Liu et al. 2025, arXiv:2510.01555).
    """
    _same_shape(logp=logp, logp_ref=logp_ref)
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
    log_r = logp_ref - logp
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r ** 2
    return torch.expm1(log_r) - log_r


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float = 1.0, lam: float = 0.95) -> torch.Tensor:
    """Generalised advantage estimates of one episode (Schulman et al. 2016, arXiv:1506.02438, eq. 16).

    ``rewards`` has T entries; ``values`` has T + 1 (the last is the value after
    the episode, 0 if it ended). ``delta_t = r_t + gamma V_{t+1} - V_t`` and
    ``A_t = sum_l (gamma lam)^l delta_{t+l}``.
    """
    if rewards.dim() != 1 or values.shape != (rewards.numel() + 1,):
        raise ValueError(f"rewards must be 1-D (T,) and values (T + 1,), got {tuple(rewards.shape)} "
                         f"and {tuple(values.shape)}")
    for name, value in (("gamma", gamma), ("lam", lam)):
        if not 0 <= value <= 1:
            raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    deltas = rewards + gamma * values[1:] - values[:-1]
    advantages = torch.zeros_like(rewards)
    running = torch.zeros((), dtype=rewards.dtype)
    for t in range(rewards.numel() - 1, -1, -1):
        running = deltas[t] + gamma * lam * running
        advantages[t] = running
    return advantages
