"""GRPO's two normalisations and the variants that remove their biases (Dr. GRPO, DAPO), as TRL names them.

GRPO (Shao et al. 2024, arXiv:2402.03300, eq. 3) divides twice:

1. each advantage by its group's reward standard deviation,
   ``A_i = (r_i - mean(r_group)) / std(r_group)``;
2. each response's summed token loss by its own length ``|o_i|``, then
   averages over responses.

Liu et al. ("Understanding R1-Zero-Like Training: A Critical Perspective",
arXiv:2503.20783, "Dr. GRPO") show that (1) weights questions
that are nearly always or nearly never solved (small ``std``) more heavily, a
*question-level difficulty bias*, and that (2) gives a correct short response a
larger per-token gradient than a correct long one, and a wrong long response a
smaller per-token penalty than a wrong short one: a *length bias* that lets
wrong answers grow longer. Dr. GRPO drops both divisions.

TRL's ``GRPOConfig`` exposes both choices (``trl/trainer/grpo_config.py`` and
``grpo_trainer.py``): ``scale_rewards`` in ``{"group", "batch", "none"}``
(``"batch"`` divides by the standard deviation of the whole batch, PPO-Lite,
arXiv:2508.08221) and ``loss_type`` in ``{"grpo", "bnpo", "dr_grpo", "dapo", ...}``.
This module reproduces those definitions on one process:

- :func:`group_advantages`: the advantages under each ``scale_rewards``;
- :func:`aggregate_token_loss`: a ``(batch, T)`` per-token loss reduced to a
  scalar under each ``loss_type``.
"""

from __future__ import annotations

import torch

from utils.rl.objectives import GRPO_EPS, grpo_advantages
from utils.validate import check_positive_int

SCALE_REWARDS = ("group", "batch", "none")
"""The values :func:`group_advantages` accepts for ``scale_rewards`` (TRL's names)."""
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
"""The values :func:`aggregate_token_loss` accepts for ``loss_type`` (TRL's names)."""


def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group") -> torch.Tensor:
    """Group-relative advantages ``A_i = (r_i - mean_group(r)) / s``, one per response.

    ``rewards`` is 1-D, consecutive groups of ``group_size`` responses to one prompt.
    The scale ``s`` depends on ``scale_rewards`` (TRL's ``GRPOConfig.scale_rewards``):

    - ``"group"``: ``s = std_group(r) + eps``, GRPO's z-score (arXiv:2402.03300,
      section 4.1.2); identical to :func:`utils.rl.objectives.grpo_advantages`;
    - ``"batch"``: ``s = std_batch(r) + eps``, the standard deviation of all
      rewards of the batch, with the mean still the group's (PPO-Lite, arXiv:2508.08221);
    - ``"none"``: ``s = 1``, Dr. GRPO's advantage (arXiv:2503.20783).

    Standard deviations are the unbiased ones, as in TRL; ``eps`` is
    :data:`utils.rl.objectives.GRPO_EPS` (TRL adds ``1e-4``).
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    if scale_rewards == "group":
        return grpo_advantages(rewards, group_size)
    check_positive_int("group_size", group_size)
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a length that is a multiple of group_size ({group_size}), "
                         f"got shape {tuple(rewards.shape)}")
    rewards = rewards.to(torch.float64 if rewards.dtype == torch.float64 else torch.float32)
    centred = (rewards.reshape(-1, group_size) - rewards.reshape(-1, group_size).mean(1, keepdim=True)).reshape(-1)
    if scale_rewards == "none":
        return centred
    std = rewards.std() if rewards.numel() > 1 else torch.zeros((), dtype=rewards.dtype)
    return centred / (std + GRPO_EPS)


def aggregate_token_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, loss_type: str = "grpo",
                         max_completion_length: int | None = None) -> torch.Tensor:
    """Reduce a ``(batch, T)`` per-token loss ``l_{i,t}`` over the real tokens (``mask``) to a scalar.

    With ``m_{i,t}`` the mask, ``|o_i| = sum_t m_{i,t}``, ``G`` the batch size
    and ``L`` = ``max_completion_length`` (TRL's ``GRPOTrainer`` loss, ``loss_type``):

    - ``"grpo"``: ``(1/G) sum_i (1/|o_i|) sum_t m l``: each response's mean, then the mean over responses
      (DeepSeekMath eq. 3); biased by length (Dr. GRPO, arXiv:2503.20783);
    - ``"bnpo"``: ``sum_{i,t} m l / sum_{i,t} m``: the mean over all real tokens of the batch;
    - ``"dapo"``: ``sum_{i,t} m l / N``, ``N`` the number of real tokens in the *global* batch
      (all processes and gradient-accumulation steps; DAPO, arXiv:2503.14476, section 3.3). On one
      process and one batch, as here, ``N = sum m`` and it equals ``"bnpo"``; they differ when
      TRL accumulates gradients or runs several processes, where ``"bnpo"`` normalises each
      local batch alone;
    - ``"dr_grpo"``: ``sum_{i,t} m l / (G L)``: a constant denominator, so every token weighs the
      same whatever its response's length (Dr. GRPO). Needs ``max_completion_length``.

    Responses with no real token count as length 1 in ``"grpo"`` (TRL clamps at 1), and an
    all-padding batch gives 0.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if per_token_loss.dim() != 2 or mask.shape != per_token_loss.shape:
        raise ValueError(f"per_token_loss and mask must both be (batch, T), got {tuple(per_token_loss.shape)} "
                         f"and {tuple(mask.shape)}")
    mask = mask.to(per_token_loss.dtype)
    masked = per_token_loss * mask
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type in ("bnpo", "dapo"):
        return masked.sum() / mask.sum().clamp(min=1.0)
    if max_completion_length is None:
        raise ValueError("loss_type 'dr_grpo' needs max_completion_length (the constant L of its denominator)")
    check_positive_int("max_completion_length", max_completion_length)
    if max_completion_length < per_token_loss.shape[1]:
        raise ValueError(f"max_completion_length ({max_completion_length}) must be at least the number of "
                         f"token positions ({per_token_loss.shape[1]})")
    return masked.sum() / (per_token_loss.shape[0] * max_completion_length)
