import math

import pytest
import torch

from utils.rl import AdaptiveKLController, entropy_bonus, gae, ppo_clip_loss, ppo_loss, ppo_value_loss, value_targets
from utils.rl.ppo import approx_kl, ppo_penalty_loss, should_stop_early


def test_entropy_of_a_uniform_distribution_is_log_v():
    for v in (1, 2, 7, 50):
        assert entropy_bonus(torch.full((3, v), 1.3, dtype=torch.float64)).item() == pytest.approx(math.log(v))


def test_entropy_matches_the_definition_and_respects_the_mask():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 5, generator=gen, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    per_token = -(p * p.log()).sum(-1)  # -sum p log p, independently of the logsumexp form
    assert entropy_bonus(logits).item() == pytest.approx(per_token.mean().item())
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    expected = (per_token[0, 0] + per_token[0, 1] + per_token[1, 0]) / 3
    assert entropy_bonus(logits, mask).item() == pytest.approx(expected.item())
    # a one-hot (very peaked) distribution has entropy about 0
    assert entropy_bonus(torch.tensor([[100.0, 0.0, 0.0]])).item() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="mask must have the shape"):
        entropy_bonus(logits, torch.ones(2, 5))
    with pytest.raises(ValueError, match="selects no element"):
        entropy_bonus(logits, torch.zeros(2, 4))


def test_unclipped_value_loss_is_half_the_mean_squared_error():
    v, r = torch.tensor([0.0, 1.0, 3.0]), torch.tensor([1.0, 1.0, 1.0])
    assert ppo_value_loss(v, torch.zeros(3), r).item() == pytest.approx(0.5 * (1 + 0 + 4) / 3)


@pytest.mark.parametrize("value, old, target, expected, has_grad", [
    # inside the clip range: the plain squared error, gradient flows
    (0.1, 0.0, 1.0, 0.81, True),
    # moved 0.5 towards the target, beyond clip 0.2: clipped value 0.2 is further (0.64 > 0.25), max picks it, no grad
    (0.5, 0.0, 1.0, 0.64, False),
    # moved 0.5 away from the target: the unclipped error (2.25) is the larger, gradient flows and pulls it back
    (-0.5, 0.0, 1.0, 2.25, True),
    # overshot the target by far: unclipped (1.5 - 1)^2 = 0.25 < clipped (0.2 - 1)^2 = 0.64, so no grad
    (1.5, 0.0, 1.0, 0.64, False),
])
def test_clipped_value_loss_case_by_case(value, old, target, expected, has_grad):
    """OpenAI baselines ppo2 / TRL: 1/2 max((V - R)^2, (old + clamp(V - old, -c, c) - R)^2), c = 0.2."""
    v = torch.tensor([value], dtype=torch.float64, requires_grad=True)
    loss = ppo_value_loss(v, torch.tensor([old], dtype=torch.float64), torch.tensor([target], dtype=torch.float64),
                          clip=0.2)
    assert loss.item() == pytest.approx(0.5 * expected)
    (grad,) = torch.autograd.grad(loss, v)
    assert (grad.abs().item() > 0) == has_grad


def test_value_targets_are_lambda_returns():
    """A^GAE + V_old = G_t when lambda = 1 and the TD target when lambda = 0 (Schulman et al. 2016)."""
    r = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    v = torch.tensor([0.5, 0.2, 0.1, 0.0], dtype=torch.float64)
    g = 0.9
    torch.testing.assert_close(value_targets(gae(r, v, g, 1.0), v[:-1]),
                               torch.tensor([1 + 0.81 * 2, 0.9 * 2, 2.0], dtype=torch.float64))
    torch.testing.assert_close(value_targets(gae(r, v, g, 0.0), v[:-1]), r + g * v[1:])


def test_ppo_loss_is_eq9_negated():
    gen = torch.Generator().manual_seed(1)
    n, vocab = 6, 4
    logits = torch.randn(n, vocab, generator=gen, dtype=torch.float64)
    logp_old = torch.randn(n, generator=gen, dtype=torch.float64) - 1
    logp_new = logp_old + 0.3 * torch.randn(n, generator=gen, dtype=torch.float64)
    adv, values, old_values, returns = (torch.randn(n, generator=gen, dtype=torch.float64) for _ in range(4))
    out = ppo_loss(logp_new, logp_old, adv, values, old_values, returns, logits, clip=0.2, clip_value=0.2,
                   vf_coef=0.7, ent_coef=0.01)
    policy = ppo_clip_loss(logp_new, logp_old, adv, 0.2)
    value = ppo_value_loss(values, old_values, returns, 0.2)
    entropy = entropy_bonus(logits)
    torch.testing.assert_close(out.total, policy + 0.7 * value - 0.01 * entropy)
    assert (out.policy, out.value, out.entropy) == (policy, value, entropy)
    assert ppo_loss(logp_new, logp_old, adv, values, old_values, returns).entropy.item() == 0
    with pytest.raises(ValueError, match="needs the policy's logits"):
        ppo_loss(logp_new, logp_old, adv, values, old_values, returns, ent_coef=0.01)


def test_adaptive_kl_rule_of_the_ppo_paper():
    """Schulman et al. 2017, section 4: d < d_targ / 1.5 halves beta, d > 1.5 d_targ doubles it."""
    ctl = AdaptiveKLController(beta=1.0, target=0.01)
    assert ctl.update(0.02) == 2.0        # 0.02 > 0.015
    assert ctl.update(0.015) == 2.0       # exactly 1.5 d_targ: unchanged
    assert ctl.update(0.01) == 2.0        # on target
    assert ctl.update(0.0067) == 2.0      # above 0.01 / 1.5 = 0.00667
    assert ctl.update(0.006) == 1.0       # below: halved
    assert ctl.update(0.0) == 0.5
    with pytest.raises(ValueError):
        AdaptiveKLController(beta=1.0, target=0.0)
    with pytest.raises(ValueError):
        ctl.update(-0.1)


def test_early_stopping_and_approx_kl():
    """Spinning Up: approx_kl = mean(logp_old - logp), stop when it exceeds 1.5 target_kl."""
    logp_old, logp_new = torch.log(torch.tensor([0.5, 0.25])), torch.log(torch.tensor([0.4, 0.25]))
    assert approx_kl(logp_new, logp_old).item() == pytest.approx(math.log(0.5 / 0.4) / 2)
    assert not should_stop_early(0.015, 0.01) and should_stop_early(0.0151, 0.01)


def test_penalty_loss_and_its_unbiased_sampled_kl():
    """PPO-Penalty's eq. 8; and the sampled k1 averages to the exact KL(pi_old || pi) over pi_old."""
    old = torch.log_softmax(torch.tensor([0.2, -0.3, 1.0], dtype=torch.float64), 0)
    new = torch.log_softmax(torch.tensor([0.5, -0.1, 0.7], dtype=torch.float64), 0)
    exact_kl = (old.exp() * (old - new)).sum()
    actions = torch.multinomial(old.exp(), 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    assert approx_kl(new[actions], old[actions]).item() == pytest.approx(exact_kl.item(), rel=0.05)
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    loss = ppo_penalty_loss(new, old, adv, torch.full((3,), exact_kl.item(), dtype=torch.float64), beta=3.0)
    assert loss.item() == pytest.approx(-((new - old).exp() * adv - 3.0 * exact_kl).mean().item())


def _batch():
    gen = torch.Generator().manual_seed(4)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    rewards, values = (torch.randn(3, 3, generator=gen, dtype=torch.float64) for _ in range(2))
    return rewards, values, mask


def test_masked_gae_is_gae_row_by_row():
    from utils.rl.ppo import masked_gae
    rewards, values, mask = _batch()
    adv = masked_gae(rewards, values, mask, gamma=0.9, lam=0.8)
    for row in range(3):
        n = int(mask[row].sum())
        expected = gae(rewards[row, :n], torch.cat([values[row, :n], torch.zeros(1, dtype=torch.float64)]), 0.9, 0.8)
        torch.testing.assert_close(adv[row, :n], expected)
        assert torch.all(adv[row, n:] == 0)


def test_token_rewards_sum_to_eq2_objective():
    """InstructGPT eq. 2 for one response: score - beta (log pi(y|x) - log pi_ref(y|x)), spread over tokens."""
    from utils.rl.ppo import token_rewards
    logp, logp_ref, mask = _batch()
    scores = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    r = token_rewards(logp, logp_ref, scores, mask, beta=0.1)
    for row in range(3):
        n = int(mask[row].sum())
        expected = scores[row] - 0.1 * (logp[row, :n] - logp_ref[row, :n]).sum()
        assert r[row, :n].sum().item() == pytest.approx(expected.item())
        assert r[row, n - 1].item() == pytest.approx(scores[row].item() - 0.1 * (logp[row, n - 1] - logp_ref[row, n - 1]).item())
        assert torch.all(r[row, n:] == 0)
    with pytest.raises(ValueError, match="prefix"):
        token_rewards(logp, logp_ref, scores, torch.tensor([[1, 0, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.bool), 0.1)
