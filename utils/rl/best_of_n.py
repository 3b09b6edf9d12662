"""Reweighting a reference policy by a 0/1 checker: best-of-N and the KL-regularised optimum, exactly.

With a checker that accepts one response ``y*`` per prompt (the tiny model's
``f"{a + b}."``), any policy that keeps the reference's proportions *within* the
right and within the wrong responses is fixed by one number per prompt, its
accuracy ``q``; with ``p = pi_ref(y* | x)`` its KL to the reference is the
binary KL

    KL(q || p) = q log(q / p) + (1 - q) log((1 - q) / (1 - p)).

Two such policies matter (both computed here exactly, without sampling):

- **best-of-N** with the checker (sample N responses from ``pi_ref``, return a
  right one if any): ``q = 1 - (1 - p)^N``. The formula ``log N - (N - 1) / N``
  often quoted for its KL (Stiennon et al. 2020) is only an upper bound
  (Beirami et al., arXiv:2401.01879); for a 0/1 reward the binary KL above is exact;
- the **optimum of the KL-regularised objective** ``max E[r] - beta KL(pi || pi_ref)``,
  ``pi*(y) ∝ pi_ref(y) exp(r(y) / beta)`` (DPO, arXiv:2305.18290, eq. 4):
  ``q = p e^{1/beta} / (p e^{1/beta} + 1 - p)``. Over ``beta`` it traces the
  least KL any policy needs for a given mean accuracy (a Lagrangian argument), the
  frontier no training method can beat.
"""

from __future__ import annotations

import torch
from torch import nn

from utils.rl.tiny_lm import pad_sequence, sequence_logprob
from utils.validate import check_positive, check_positive_int


@torch.no_grad()
def right_answer_probability(model: nn.Module, problems: list[tuple[int, int]]) -> torch.Tensor:
    """``(len(problems),)`` float64: ``pi(y* | x)``, the probability that ``model`` samples exactly ``"{a + b}."``."""
    if not problems:
        raise ValueError("problems must not be empty")
    right = torch.tensor([pad_sequence(f"{a}+{b}={a + b}.") for a, b in problems])
    return sequence_logprob(model, right).double().exp()


def binary_kl(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Elementwise ``q log(q/p) + (1-q) log((1-q)/(1-p))`` in nats, with ``0 log 0 = 0``; ``p, q`` in [0, 1]."""
    q, p = torch.as_tensor(q, dtype=torch.float64), torch.as_tensor(p, dtype=torch.float64)
    if ((p < 0) | (p > 1) | (q < 0) | (q > 1)).any():
        raise ValueError("p and q must lie in [0, 1]")
    right = torch.where(q > 0, q * (torch.log(q.clamp(min=1e-300)) - torch.log(p.clamp(min=1e-300))), 0.0)
    wrong = torch.where(q < 1, (1 - q) * (torch.log1p(-q.clamp(max=1 - 1e-16)) - torch.log1p(-p.clamp(max=1 - 1e-16))),
                        0.0)
    return right + wrong


def best_of_n(p: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per prompt, ``(accuracy q = 1 - (1 - p)^n, KL(best-of-n || pi_ref))`` for right-answer probabilities ``p``."""
    check_positive_int("n", n)
    p = torch.as_tensor(p, dtype=torch.float64)
    q = 1 - (1 - p) ** n
    return q, binary_kl(q, p)


def kl_regularised_optimum(p: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per prompt, ``(accuracy, KL to pi_ref)`` of ``pi* ∝ pi_ref exp(r / beta)`` for a 0/1 reward."""
    check_positive("beta", beta)
    p = torch.as_tensor(p, dtype=torch.float64)
    q = torch.sigmoid(torch.log(p) - torch.log1p(-p) + 1.0 / beta)  # the odds p / (1 - p) times e^(1/beta)
    return q, binary_kl(q, p)
