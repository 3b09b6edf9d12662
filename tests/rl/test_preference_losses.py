import math

import pytest
import torch

from utils.rl import bradley_terry_loss, dpo_loss
from utils.rl.preference_losses import ipo_loss, kto_loss, kto_reference_point, simpo_loss


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


PC, PR, RC, RR = (torch.tensor(v, dtype=torch.float64) for v in
                  ([-1.0, -2.0, -4.0], [-3.0, -1.5, -2.0], [-1.5, -2.5, -3.0], [-2.0, -1.0, -2.5]))


def test_ipo_loss_is_the_papers_formula():
    """Azar et al. 2023, eq. 17: (h - 1 / (2 tau))^2, h the margin of log-ratios, written out per pair."""
    tau = 0.25
    expected = sum(((a - c) - (b - d) - 1 / (2 * tau)) ** 2
                   for a, b, c, d in zip(PC.tolist(), PR.tolist(), RC.tolist(), RR.tolist())) / 3
    assert ipo_loss(PC, PR, RC, RR, tau=tau).item() == pytest.approx(expected)


@pytest.mark.parametrize("tau", [0.05, 0.1, 1.0])
def test_ipo_minimiser_is_a_finite_margin_where_dpo_has_none(tau):
    """Gradient descent on a free margin settles at 1 / (2 tau) under IPO; DPO's loss keeps falling past it."""
    margin = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    zero = torch.zeros(1, dtype=torch.float64)
    opt = torch.optim.SGD([margin], lr=0.2)
    for _ in range(300):
        opt.zero_grad()
        ipo_loss(margin, zero, zero, zero, tau=tau).backward()
        opt.step()
    assert margin.item() == pytest.approx(1 / (2 * tau), rel=1e-9)
    at = torch.full((1,), 1 / (2 * tau), dtype=torch.float64)
    assert ipo_loss(at, zero, zero, zero, tau=tau).item() == pytest.approx(0.0, abs=1e-20)
    assert ipo_loss(2 * at, zero, zero, zero, tau=tau) > 0  # overshooting is penalised
    assert dpo_loss(2 * at, zero, zero, zero, beta=tau) < dpo_loss(at, zero, zero, zero, beta=tau)


def test_kto_loss_is_the_papers_formula_with_its_weights():
    """Ethayarajh et al. 2024, section 4.1: lambda_y - v(x, y), written out per answer."""
    policy, ref = PC, RC
    desirable = torch.tensor([True, False, True])
    beta, z0, lam_d, lam_u = 0.5, 0.3, 1.0, 1.33
    terms = []
    for p, r, d in zip(policy.tolist(), ref.tolist(), desirable.tolist()):
        ratio = p - r
        terms.append(lam_d * (1 - _sigmoid(beta * (ratio - z0))) if d else lam_u * (1 - _sigmoid(beta * (z0 - ratio))))
    got = kto_loss(policy, ref, desirable, z0, beta=beta, desirable_weight=lam_d, undesirable_weight=lam_u)
    assert got.item() == pytest.approx(sum(terms) / 3)


def test_kto_weights_scale_only_their_own_kind():
    policy, ref = PC, RC
    desirable = torch.tensor([True, True, True])
    base = kto_loss(policy, ref, desirable, 0.0)
    assert kto_loss(policy, ref, desirable, 0.0, desirable_weight=3.0).item() == pytest.approx(3 * base.item())
    assert kto_loss(policy, ref, desirable, 0.0, undesirable_weight=3.0).item() == pytest.approx(base.item())


def test_kto_limits_and_symmetry():
    """A desirable answer far above z0 and an undesirable one far below cost nothing; at r = z0 each costs lambda / 2;
    an undesirable answer at z0 + d costs what a desirable one at z0 - d does."""
    z0 = 0.4
    big = torch.tensor([50.0], dtype=torch.float64)
    ref = torch.zeros(1, dtype=torch.float64)
    yes, no = torch.tensor([True]), torch.tensor([False])
    assert kto_loss(z0 + big, ref, yes, z0, beta=1.0).item() == pytest.approx(0.0, abs=1e-20)
    assert kto_loss(z0 - big, ref, no, z0, beta=1.0).item() == pytest.approx(0.0, abs=1e-20)
    at = torch.tensor([z0], dtype=torch.float64)
    assert kto_loss(at, ref, yes, z0, desirable_weight=2.0).item() == pytest.approx(1.0)
    d = torch.tensor([0.7], dtype=torch.float64)
    assert kto_loss(z0 + d, ref, no, z0).item() == pytest.approx(kto_loss(z0 - d, ref, yes, z0).item())


def test_kto_reference_point_is_a_clipped_detached_mean_log_ratio():
    policy = torch.tensor([-1.0, -2.0], requires_grad=True)
    ref = torch.tensor([-1.5, -2.1])
    z0 = kto_reference_point(policy, ref)
    assert z0.item() == pytest.approx((0.5 + 0.1) / 2)
    assert not z0.requires_grad
    assert kto_reference_point(ref, policy.detach()).item() == 0.0  # a negative mean is clipped to 0


def test_simpo_loss_is_the_papers_formula():
    """Meng et al. 2024, eq. 6, written out per pair."""
    lc, lr = torch.tensor([4.0, 10.0, 2.0], dtype=torch.float64), torch.tensor([8.0, 5.0, 2.0], dtype=torch.float64)
    beta, gamma = 2.0, 0.5
    expected = sum(-math.log(_sigmoid(beta * a / m - beta * b / n - gamma))
                   for a, b, m, n in zip(PC.tolist(), PR.tolist(), lc.tolist(), lr.tolist())) / 3
    assert simpo_loss(PC, PR, lc, lr, beta=beta, gamma=gamma).item() == pytest.approx(expected)


def test_simpo_normalises_by_length_and_reduces_to_bradley_terry():
    lengths = torch.tensor([4.0, 4.0, 4.0], dtype=torch.float64)
    base = simpo_loss(PC, PR, lengths, lengths, beta=2.0, gamma=0.5)
    # twice as long with twice the log-probability: the same mean log-prob, the same loss
    assert simpo_loss(2 * PC, PR, 2 * lengths, lengths, beta=2.0, gamma=0.5).item() == pytest.approx(base.item())
    # gamma = 0: Bradley-Terry on the per-token rewards beta * logp / |y|
    got = simpo_loss(PC, PR, lengths, lengths, beta=2.0, gamma=0.0)
    assert got.item() == pytest.approx(bradley_terry_loss(2.0 * PC / 4, 2.0 * PR / 4).item())
    # a larger target margin always costs more
    assert simpo_loss(PC, PR, lengths, lengths, beta=2.0, gamma=1.0) > base


def test_bad_input_raises():
    z = torch.zeros(2)
    with pytest.raises(ValueError, match="same shape"):
        ipo_loss(z, z, z, torch.zeros(3))
    with pytest.raises(ValueError, match="tau"):
        ipo_loss(z, z, z, z, tau=0.0)
    with pytest.raises(ValueError, match="boolean"):
        kto_loss(z, z, torch.ones(2), 0.0)
    with pytest.raises(ValueError, match="reference_point"):
        kto_loss(z, z, torch.ones(2, dtype=torch.bool), -0.1)
    with pytest.raises(ValueError, match="reference_point"):
        kto_loss(z, z, torch.ones(2, dtype=torch.bool), float("nan"))
    with pytest.raises(ValueError, match="undesirable_weight"):
        kto_loss(z, z, torch.ones(2, dtype=torch.bool), 0.0, undesirable_weight=0)
    with pytest.raises(ValueError, match="at least one"):
        kto_loss(torch.zeros(0), torch.zeros(0), torch.zeros(0, dtype=torch.bool), 0.0)
    with pytest.raises(ValueError, match="at least one"):
        kto_reference_point(torch.zeros(0), torch.zeros(0))
    with pytest.raises(ValueError, match="rejected_lengths"):
        simpo_loss(z, z, torch.ones(2), torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="gamma"):
        simpo_loss(z, z, torch.ones(2), torch.ones(2), gamma=-1.0)
