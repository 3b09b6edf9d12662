import math

import pytest
import torch

from utils.rl import bradley_terry_loss, dpo_loss, gae, grpo_advantages, kl_estimate, ppo_clip_loss


def test_dpo_loss_is_the_papers_formula():
    """Rafailov et al. 2023, eq. 7, computed by hand for two pairs."""
    pc, pr, rc, rr = (torch.tensor(v) for v in ([-1.0, -2.0], [-3.0, -1.5], [-1.5, -2.5], [-2.0, -1.0]))
    beta = 0.5
    expected = sum(-math.log(1 / (1 + math.exp(-beta * ((a - c) - (b - d)))))
                   for a, b, c, d in zip(pc.tolist(), pr.tolist(), rc.tolist(), rr.tolist())) / 2
    assert dpo_loss(pc, pr, rc, rr, beta=beta).item() == pytest.approx(expected)
    same = torch.zeros(3)
    assert dpo_loss(same, same, same, same).item() == pytest.approx(math.log(2))


def test_ppo_clip_loss_clips_only_in_the_direction_of_the_advantage():
    """Schulman et al. 2017, eq. 7: min(rho A, clip(rho) A)."""
    logp_old = torch.zeros(4)
    logp_new = torch.log(torch.tensor([1.1, 1.5, 0.5, 1.5])).requires_grad_()
    adv = torch.tensor([1.0, 1.0, -1.0, -2.0])
    loss = ppo_clip_loss(logp_new, logp_old, adv, clip=0.2)
    # terms: 1.1 (inside), 1.2 (clipped above, A > 0), -0.8 (clipped below, A < 0), -3.0 (A = -2, not clipped: min picks rho A)
    assert loss.item() == pytest.approx(-(1.1 + 1.2 - 0.8 - 3.0) / 4, abs=1e-6)
    (grad,) = torch.autograd.grad(loss, logp_new)
    assert grad[1] == 0 and grad[2] == 0 and grad[0] != 0 and grad[3] != 0


def test_grpo_advantages_are_group_z_scores():
    """Shao et al. 2024, section 4.1.2: A_i = (r_i - mean(r)) / std(r)."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    adv = grpo_advantages(rewards, group_size=4)
    first = torch.tensor([1.0, 0.0, 0.0, 1.0])
    torch.testing.assert_close(adv[:4], (first - 0.5) / (first.std() + 1e-6))
    assert torch.all(adv[4:] == 0)
    with pytest.raises(ValueError, match="multiple of group_size"):
        grpo_advantages(torch.ones(6), group_size=4)


def test_bradley_terry_loss():
    assert bradley_terry_loss(torch.tensor([2.0]), torch.tensor([0.0])).item() == pytest.approx(
        -math.log(1 / (1 + math.exp(-2))))


def test_gae_limits():
    """lam = 0: the one-step TD error; lam = 1: the discounted return minus the value (Schulman et al. 2016)."""
    r, v = torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.5, 0.2, 0.1, 0.0])
    torch.testing.assert_close(gae(r, v, gamma=0.9, lam=0.0), r + 0.9 * v[1:] - v[:-1])
    returns = torch.tensor([1 + 0.9 * 0 + 0.81 * 2, 0 + 0.9 * 2, 2.0])
    torch.testing.assert_close(gae(r, v, gamma=0.9, lam=1.0), returns - v[:-1])


def _softmax_pair(seed=0, n=6):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, generator=gen, dtype=torch.float64).requires_grad_()
    logp_ref = torch.log_softmax(torch.randn(n, generator=gen, dtype=torch.float64), 0)
    return logits, logp_ref


def _kl(logp_a, logp_b):
    """Exact KL(a || b) of two distributions over the same few outcomes."""
    return (logp_a.exp() * (logp_a - logp_b)).sum()


def _expected_gradient(logits, logp_ref, estimator, sampler_logp=None):
    """E_{x ~ sampler}[grad_theta k(x)], by enumeration; the sampler defaults to pi_theta, held fixed."""
    logp = torch.log_softmax(logits, 0)
    weights = (logp if sampler_logp is None else sampler_logp).detach().exp()
    (grad,) = torch.autograd.grad((weights * kl_estimate(logp, logp_ref, estimator)).sum(), logits)
    return grad


def test_k1_and_k3_values_are_unbiased_on_samples_from_pi_only():
    """Schulman 2020: E_{x ~ pi}[k1] = E_{x ~ pi}[k3] = KL(pi || pi_ref), k2 is biased; k2, k3 >= 0."""
    logits, logp_ref = _softmax_pair()
    logp = torch.log_softmax(logits, 0).detach()
    kl = _kl(logp, logp_ref)
    for name in ("k1", "k3"):
        torch.testing.assert_close((logp.exp() * kl_estimate(logp, logp_ref, name)).sum(), kl)
    assert abs((logp.exp() * kl_estimate(logp, logp_ref, "k2")).sum() - kl) > 1e-3
    assert (kl_estimate(logp, logp_ref, "k3") >= 0).all() and (kl_estimate(logp, logp_ref, "k1") < 0).any()
    # On samples from another policy (GRPO's pi_old), the mean of k3 is not KL(pi || pi_ref).
    logp_old = torch.log_softmax(logp + 0.5 * torch.randn(6, generator=torch.Generator().manual_seed(3),
                                                            dtype=torch.float64), 0)
    assert abs((logp_old.exp() * kl_estimate(logp, logp_ref, "k3")).sum() - kl) > 1e-3


def test_k3_as_a_loss_has_the_gradient_of_the_forward_kl():
    """E_{x ~ pi}[grad k3] = grad KL(pi_ref || pi), not grad KL(pi || pi_ref) (arXiv:2506.09477, 2510.01555).

    By hand: grad k3 = (1 - pi_ref / pi) grad log pi, whose mean under pi is
    -sum_x pi_ref(x) grad log pi(x) = grad KL(pi_ref || pi).
    """
    logits, logp_ref = _softmax_pair()
    (forward,) = torch.autograd.grad(_kl(logp_ref, torch.log_softmax(logits, 0)), logits)
    (reverse,) = torch.autograd.grad(_kl(torch.log_softmax(logits, 0), logp_ref), logits)
    k3_grad = _expected_gradient(logits, logp_ref, "k3")
    torch.testing.assert_close(k3_grad, forward)
    assert (k3_grad - reverse).abs().max() > 1e-2
    # k2 as a loss has the reverse KL's gradient on-policy; k1's expected gradient is zero.
    torch.testing.assert_close(_expected_gradient(logits, logp_ref, "k2"), reverse)
    torch.testing.assert_close(_expected_gradient(logits, logp_ref, "k1"), torch.zeros_like(logits))


@pytest.mark.parametrize("call, match", [
    (lambda: kl_estimate(torch.zeros(2), torch.zeros(2), "k4"), "estimator"),
    (lambda: kl_estimate(torch.zeros(2), torch.zeros(3)), "same shape"),
    (lambda: dpo_loss(torch.zeros(2), torch.zeros(3), torch.zeros(2), torch.zeros(2)), "same shape"),
    (lambda: dpo_loss(torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(2), beta=0), "beta"),
    (lambda: ppo_clip_loss(torch.zeros(2), torch.zeros(2), torch.zeros(2), clip=-1), "clip"),
    (lambda: grpo_advantages(torch.ones(4), group_size=0), "group_size"),
    (lambda: gae(torch.zeros(3), torch.zeros(3)), "values"),
])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()
