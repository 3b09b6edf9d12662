import math

import pytest
import torch

from utils.rl.grpo_variants import LOSS_TYPES, SCALE_REWARDS, aggregate_token_loss, group_advantages
from utils.rl.objectives import grpo_advantages

# Two groups of 4: one of 4 answers right (mean 1/4), two of 4 right (mean 1/2).
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
CENTRED = [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5]


def test_group_scaling_is_grpo_z_scores_by_hand():
    # group 1: unbiased std = sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5; group 2: sqrt(4 * 0.25 / 3) = 1/sqrt(3)
    expected = [1.5, -0.5, -0.5, -0.5] + [0.5 * math.sqrt(3), 0.5 * math.sqrt(3), -0.5 * math.sqrt(3),
                                          -0.5 * math.sqrt(3)]
    got = group_advantages(REWARDS, 4, "group")
    assert got.tolist() == pytest.approx(expected, abs=1e-5)
    assert torch.equal(got, grpo_advantages(REWARDS, 4))


def test_no_scaling_is_the_centred_reward():
    assert group_advantages(REWARDS, 4, "none").tolist() == pytest.approx(CENTRED, abs=1e-7)


def test_batch_scaling_divides_by_the_std_of_the_whole_batch():
    # 3 ones and 5 zeros: mean 3/8, unbiased variance (3 (5/8)^2 + 5 (3/8)^2) / 7 = 15/56
    std = math.sqrt(15 / 56)
    assert group_advantages(REWARDS, 4, "batch").tolist() == pytest.approx([c / std for c in CENTRED], abs=1e-5)


def test_std_scaling_weighs_a_rarely_solved_question_more_than_dr_grpo():
    """The difficulty bias: with z-scores, one right answer in 8 gets advantage 2.47; unscaled it gets 0.875."""
    rewards = torch.tensor([1.0] + [0.0] * 7)
    z, plain = group_advantages(rewards, 8, "group")[0].item(), group_advantages(rewards, 8, "none")[0].item()
    assert z == pytest.approx(0.875 / math.sqrt(1 / 8), rel=1e-5)  # unbiased std of 1 in 8: sqrt(8/7 * 7/64)
    assert plain == pytest.approx(0.875)


def test_equal_rewards_give_zero_advantages_under_every_scaling():
    for scale in SCALE_REWARDS:
        assert group_advantages(torch.ones(8), 4, scale).abs().max().item() == 0


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[True, True, False], [True, True, True]])


def test_aggregations_by_hand():
    assert aggregate_token_loss(LOSS, MASK, "grpo").item() == pytest.approx((1.5 + 5.0) / 2)  # per-response means
    assert aggregate_token_loss(LOSS, MASK, "bnpo").item() == pytest.approx(18 / 5)  # 5 real tokens
    assert aggregate_token_loss(LOSS, MASK, "dapo").item() == pytest.approx(18 / 5)  # one process, one batch
    assert aggregate_token_loss(LOSS, MASK, "dr_grpo", max_completion_length=3).item() == pytest.approx(18 / 6)
    assert aggregate_token_loss(LOSS, MASK, "dr_grpo", max_completion_length=4).item() == pytest.approx(18 / 8)


def test_token_weights_show_grpo_length_bias_and_dr_grpo_constant_weight():
    """d loss / d l_{i,t}: 1 / (G |o_i|) under grpo (a short response's tokens weigh more), 1 / (G L) under dr_grpo."""
    loss = LOSS.clone().requires_grad_(True)
    aggregate_token_loss(loss, MASK, "grpo").backward()
    assert loss.grad.flatten().tolist() == pytest.approx([1 / 4, 1 / 4, 0.0, 1 / 6, 1 / 6, 1 / 6])
    loss.grad = None
    aggregate_token_loss(loss, MASK, "dr_grpo", max_completion_length=3).backward()
    assert loss.grad.flatten().tolist() == pytest.approx([1 / 6, 1 / 6, 0.0, 1 / 6, 1 / 6, 1 / 6])


def test_an_all_padding_row_counts_as_length_one_in_grpo():
    mask = torch.tensor([[False, False, False], [True, True, True]])
    assert aggregate_token_loss(LOSS, mask, "grpo").item() == pytest.approx((0 + 5.0) / 2)


@pytest.mark.parametrize("kwargs, match", [
    ({"scale_rewards": "std"}, "scale_rewards must be one of"),
])
def test_group_advantages_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(REWARDS, 4, **kwargs)
    with pytest.raises(ValueError, match="multiple of group_size"):
        group_advantages(REWARDS, 3, "none")


def test_aggregate_rejects_bad_input():
    with pytest.raises(ValueError, match="loss_type must be one of"):
        aggregate_token_loss(LOSS, MASK, "seq_mean")
    with pytest.raises(ValueError, match="max_completion_length"):
        aggregate_token_loss(LOSS, MASK, "dr_grpo")
    with pytest.raises(ValueError, match="at least the number"):
        aggregate_token_loss(LOSS, MASK, "dr_grpo", max_completion_length=2)
    with pytest.raises(ValueError, match=r"\(batch, T\)"):
        aggregate_token_loss(LOSS, MASK[:, :2], "bnpo")
    assert set(LOSS_TYPES) == {"grpo", "bnpo", "dr_grpo", "dapo"}
