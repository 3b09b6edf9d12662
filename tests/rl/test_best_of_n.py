import math

import pytest
import torch

from utils.rl.best_of_n import best_of_n, binary_kl, kl_regularised_optimum, right_answer_probability
from utils.rl.post_training import arithmetic_reward
from utils.rl.tiny_lm import TinyLM, prompt_tokens, sample


def test_binary_kl_by_hand_and_at_the_edges():
    # q = 0.75, p = 0.5: 0.75 ln 1.5 + 0.25 ln 0.5
    assert binary_kl(torch.tensor(0.75), torch.tensor(0.5)).item() == pytest.approx(
        0.75 * math.log(1.5) + 0.25 * math.log(0.5))
    assert binary_kl(torch.tensor(1.0), torch.tensor(0.2)).item() == pytest.approx(-math.log(0.2))  # always right
    assert binary_kl(torch.tensor(0.3), torch.tensor(0.3)).item() == 0
    assert binary_kl(torch.tensor(1.0), torch.tensor(1.0)).item() == 0


def test_best_of_n_accuracy_and_the_bound_it_stays_under():
    p = torch.tensor([0.1, 0.5, 0.9])
    q, kl = best_of_n(p, 4)
    assert q.tolist() == pytest.approx([1 - 0.9 ** 4, 1 - 0.5 ** 4, 1 - 0.1 ** 4])
    assert (kl <= math.log(4) - 3 / 4 + 1e-12).all()  # Beirami et al.: log n - (n-1)/n is an upper bound
    q1, kl1 = best_of_n(p, 1)
    assert torch.equal(q1, p.double()) and kl1.abs().max() == 0


def test_kl_regularised_optimum_is_the_tilt_and_beats_best_of_n():
    p = torch.tensor([0.2, 0.6])
    q, kl = kl_regularised_optimum(p, beta=0.5)
    odds = p.double() / (1 - p.double()) * math.exp(2)
    assert q.tolist() == pytest.approx((odds / (1 + odds)).tolist())
    # at the same mean accuracy as best-of-4, the optimum needs no more KL (scan beta for that accuracy)
    qn, kln = best_of_n(p, 4)
    betas = torch.logspace(-2, 2, 4001).tolist()
    beta = min(betas, key=lambda b: abs(kl_regularised_optimum(p, b)[0].mean().item() - qn.mean().item()))
    assert kl_regularised_optimum(p, beta)[1].mean().item() <= kln.mean().item() + 1e-3
    with pytest.raises(ValueError, match="beta"):
        kl_regularised_optimum(p, 0.0)


def test_right_answer_probability_matches_sampling():
    model = TinyLM(d_model=32, n_heads=2, seed=3)
    problems = [(0, 0)]
    p = right_answer_probability(model, problems).item()
    seq, _ = sample(model, prompt_tokens(problems * 20000), generator=torch.Generator().manual_seed(0))
    share = arithmetic_reward(seq).mean().item()
    assert share == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / 20000) + 1e-4)
    with pytest.raises(ValueError, match="empty"):
        right_answer_probability(model, [])
