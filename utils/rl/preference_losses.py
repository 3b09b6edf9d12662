"""Preference losses beyond DPO: IPO, KTO and SimPO.

Like :func:`utils.rl.objectives.dpo_loss`, each takes log-probabilities of
whole responses (``log pi(y | x)``, summed over the response's tokens) as
torch tensors and returns the mean loss to minimise:

- IPO (Azar et al. 2023, arXiv:2310.12036, eq. 17): a squared loss that
  regresses the log-ratio margin onto ``1 / (2 tau)`` instead of pushing it
  to infinity as DPO's logistic loss does;
- KTO (Ethayarajh et al. 2024, arXiv:2402.01306, section 4.1; eq. 7 in TRL's
  citation of it): single answers
  labelled desirable or undesirable, no pairs, scored against a reference
  point ``z0`` (an estimate of ``KL(pi || pi_ref)``);
- SimPO (Meng et al. 2024, arXiv:2405.14734, eq. 6): no reference model; the
  implicit reward is the *length-normalised* log-probability, with a target
  margin ``gamma``.

TRL implements them as ``DPOTrainer(loss_type="ipo")`` (which divides the
log-ratios by the completion's token count first), ``KTOTrainer`` and
``experimental.cpo.CPOTrainer(loss_type="simpo", cpo_alpha=0)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from utils.rl.objectives import _same_shape
from utils.validate import check_nonnegative, check_positive


def _check_finite(name: str, value: object) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def ipo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
             ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor, tau: float = 0.1) -> torch.Tensor:
    """The mean IPO loss ``(h - 1 / (2 tau))^2`` (Azar et al. 2023, eq. 17).

    ``h = log [pi(y_w) pi_ref(y_l) / (pi(y_l) pi_ref(y_w))]`` is DPO's margin of
    log-ratios. DPO's ``-log sigmoid(beta h)`` keeps falling as ``h`` grows, so
    on deterministic preferences it drives ``h`` to infinity whatever ``beta``;
    IPO's square is smallest at ``h = 1 / (2 tau)``, a finite margin that a
    larger ``tau`` keeps closer to the reference. TRL's ``DPOTrainer(loss_type="ipo")``
    uses ``beta`` for ``tau`` and divides each log-ratio by the completion's
    token count first; pass per-token averages to reproduce it.
    """
    _same_shape(policy_chosen_logps=policy_chosen_logps, policy_rejected_logps=policy_rejected_logps,
                ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    check_positive("tau", tau, finite=True)
    margin = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)
    return ((margin - 1 / (2 * tau)) ** 2).mean()


def kto_reference_point(policy_logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
    """KTO's reference point ``z0 = max(0, mean(log pi(y'|x) - log pi_ref(y'|x)))``, detached.

    The mean log-ratio over answers ``y'`` to *other* prompts of the batch
    (mismatched pairs) is a biased estimate of ``KL(pi || pi_ref)``; KTO clips it
    at zero and passes no gradient through it (Ethayarajh et al. 2024,
    section 4.1; TRL's ``KTOTrainer`` does the same).
    """
    _same_shape(policy_logps=policy_logps, ref_logps=ref_logps)
    if policy_logps.numel() == 0:
        raise ValueError("the reference point needs at least one mismatched answer, got none")
    return (policy_logps - ref_logps).mean().detach().clamp(min=0)


def kto_loss(policy_logps: torch.Tensor, ref_logps: torch.Tensor, desirable: torch.Tensor,
             reference_point: float | torch.Tensor, beta: float = 0.1, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0) -> torch.Tensor:
    """The mean KTO loss ``lambda_y - v(x, y)`` over single, labelled answers (Ethayarajh et al. 2024, section 4.1).

    TRL's ``KTOTrainer`` (``loss_type="kto"``) computes the same terms, citing them as the paper's eq. 7.

    With ``r = log pi(y|x) - log pi_ref(y|x)`` and the reference point ``z0``:

    - desirable ``y``: ``v = lambda_D sigmoid(beta (r - z0))``, so the loss is
      ``lambda_D (1 - sigmoid(beta (r - z0)))``;
    - undesirable ``y``: ``v = lambda_U sigmoid(beta (z0 - r))``, so the loss is
      ``lambda_U (1 - sigmoid(beta (z0 - r)))``.

    ``desirable`` is a boolean tensor of the same shape; ``lambda_D`` and
    ``lambda_U`` (``desirable_weight``, ``undesirable_weight``, TRL's names)
    balance unequal numbers of the two kinds. ``reference_point`` is ``z0``,
    from :func:`kto_reference_point`.
    """
    _same_shape(policy_logps=policy_logps, ref_logps=ref_logps, desirable=desirable)
    if desirable.dtype != torch.bool:
        raise ValueError(f"desirable must be a boolean tensor, got dtype {desirable.dtype}")
    if policy_logps.numel() == 0:
        raise ValueError("kto_loss needs at least one answer, got none")
    check_positive("beta", beta, finite=True)
    check_positive("desirable_weight", desirable_weight, finite=True)
    check_positive("undesirable_weight", undesirable_weight, finite=True)
    z0 = _check_finite("reference_point", reference_point)
    if z0 < 0:
        raise ValueError(f"reference_point is a KL estimate clipped at 0, so it must be >= 0, got {z0!r}")
    log_ratio = policy_logps - ref_logps
    signed = torch.where(desirable, log_ratio - z0, z0 - log_ratio)
    weight = torch.where(desirable, torch.full_like(log_ratio, desirable_weight),
                         torch.full_like(log_ratio, undesirable_weight))
    return (weight * (1 - torch.sigmoid(beta * signed))).mean()


def simpo_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
               chosen_lengths: torch.Tensor, rejected_lengths: torch.Tensor, beta: float = 2.0,
               gamma: float = 0.5) -> torch.Tensor:
    """The mean SimPO loss (Meng et al. 2024, eq. 6), with no reference model:

    ``-log sigmoid(beta / |y_w| log pi(y_w|x) - beta / |y_l| log pi(y_l|x) - gamma)``.

    The implicit reward ``beta / |y| log pi(y|x)`` is the mean token
    log-probability (the score a sampler ranks by), so a long answer is not
    penalised for having more tokens; ``gamma`` is the target reward margin
    the chosen answer must clear. ``chosen_lengths`` and ``rejected_lengths``
    are token counts (positive). ``gamma`` defaults to TRL's ``simpo_gamma``
    (0.5); ``beta`` is much larger than DPO's, since the rewards are per token.
    """
    _same_shape(policy_chosen_logps=policy_chosen_logps, policy_rejected_logps=policy_rejected_logps,
                chosen_lengths=chosen_lengths, rejected_lengths=rejected_lengths)
    check_positive("beta", beta, finite=True)
    check_nonnegative("gamma", gamma, finite=True)
    for name, lengths in (("chosen_lengths", chosen_lengths), ("rejected_lengths", rejected_lengths)):
        if lengths.numel() and not bool((lengths > 0).all()):
            raise ValueError(f"{name} are token counts and must all be positive, got {lengths.tolist()}")
    margin = beta * (policy_chosen_logps / chosen_lengths - policy_rejected_logps / rejected_lengths)
    return -F.logsigmoid(margin - gamma).mean()
