import copy

import pytest
import torch

from utils.rl.objectives import grpo_advantages
from utils.rl.post_training import (arithmetic_reward, evaluate, expert_iteration, frozen_copy, grpo_loss,
                                    kl_to_reference, lengths_by_correctness, preference_pairs, train_dpo, train_grpo)
from utils.rl.tiny_lm import TinyLM, all_prompts, encode, prompt_tokens, sample, sequence_logprob


def _small_model(seed=0):
    return TinyLM(d_model=32, n_heads=2, seed=seed)


def test_arithmetic_reward_checks_answer_and_end_mark():
    seq = torch.tensor([encode("7+8=15."), encode("7+8=16."), encode("2+2=4._"), encode("2+2=44_")])
    assert arithmetic_reward(seq).tolist() == [1.0, 0.0, 1.0, 0.0]


def test_kl_of_a_policy_to_itself_is_zero_and_positive_to_another():
    model = _small_model()
    seq, _ = sample(model, prompt_tokens(all_prompts()[:16]), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert kl_to_reference(model, frozen_copy(model), seq).abs().max().item() == 0
        assert (kl_to_reference(model, _small_model(seed=1), seq) > 0).all()


def test_kl_estimate_matches_the_monte_carlo_log_ratio():
    """E_{y~pi}[sum_t KL_t] = E_{y~pi}[log pi(y) - log pi_ref(y)] (chain rule of KL): the two estimators agree."""
    policy, ref = _small_model(0), _small_model(1)
    prompts = prompt_tokens([(3, 4)] * 4000)
    seq, _ = sample(policy, prompts, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        exact = kl_to_reference(policy, ref, seq).mean().item()
        log_ratio = (sequence_logprob(policy, seq) - sequence_logprob(ref, seq)).mean().item()
    assert exact == pytest.approx(log_ratio, rel=0.1)


def test_one_grpo_step_raises_the_expected_reward_of_a_bandit():
    """A 1-token bandit: 5 arms, arm 0 pays 1. One step on grpo_loss moves probability to arm 0."""
    torch.manual_seed(0)
    logits = torch.zeros(5, requires_grad=True)
    ref_logp = torch.log_softmax(torch.zeros(5), -1)
    for _ in range(3):
        actions = torch.multinomial(torch.softmax(logits.detach(), -1), 16, replacement=True)
        rewards = (actions == 0).float()
        if rewards.std() > 0:
            break
    before = torch.softmax(logits.detach(), -1)[0].item()
    logp_old = torch.log_softmax(logits.detach(), -1)[actions][:, None]
    logp_new = torch.log_softmax(logits, -1)[actions][:, None]
    loss = grpo_loss(logp_new, logp_old, ref_logp[actions][:, None], grpo_advantages(rewards, 16),
                     torch.ones(16, 1, dtype=torch.bool), beta=0.04)
    loss.backward()
    with torch.no_grad():
        logits -= 0.5 * logits.grad
    assert torch.softmax(logits.detach(), -1)[0].item() > before


def test_grpo_kl_term_is_zero_at_the_reference_and_pulls_back_towards_it():
    logp = torch.log(torch.tensor([[0.5, 0.2]])).requires_grad_()
    ref = torch.log(torch.tensor([[0.5, 0.2]]))
    mask = torch.ones(1, 2, dtype=torch.bool)
    assert grpo_loss(logp, logp.detach(), ref, torch.zeros(1), mask).item() == pytest.approx(0.0, abs=1e-7)
    moved = (logp.detach() + 0.3).requires_grad_()
    loss = grpo_loss(moved, moved.detach(), ref, torch.zeros(1), mask, beta=1.0)
    loss.backward()
    assert loss.item() > 0 and (moved.grad > 0).all()  # descending lowers logp back towards the reference


def test_train_grpo_raises_reward_on_a_few_problems():
    problems = [(1, 1), (2, 3)]
    policy = _small_model()
    ref = frozen_copy(policy)
    history = train_grpo(policy, ref, problems, steps=40, prompts_per_step=2, group_size=16, lr=3e-3, beta=0.0)
    assert sum(history["reward"][-5:]) > sum(history["reward"][:5])
    assert history["kl"][0] == 0 and history["kl"][-1] > 0


def test_dpo_step_increases_the_margin_between_chosen_and_rejected():
    model = _small_model()
    ref = frozen_copy(model)
    chosen = torch.tensor([encode("1+1=2._"), encode("2+3=5._")])
    rejected = torch.tensor([encode("1+1=3._"), encode("2+3=6._")])
    history = train_dpo(copy.deepcopy(model), ref, chosen, rejected, steps=5, beta=0.1, lr=1e-2, batch_size=2)
    assert history["margin"][-1] > history["margin"][0] >= 0
    assert history["loss"][-1] < history["loss"][0]


def test_preference_pairs_are_correct_against_wrong_for_the_same_prompt():
    chosen, rejected = preference_pairs(_small_model(), [(0, 0), (1, 0)], samples_per_problem=200)
    assert arithmetic_reward(chosen).eq(1).all() and arithmetic_reward(rejected).eq(0).all()
    assert torch.equal(chosen[:, :4], rejected[:, :4])


def _grpo_batch(lengths=(3, 3, 3, 3)):
    g = torch.Generator().manual_seed(0)
    logp_new = torch.log(torch.rand(4, 3, generator=g) * 0.8 + 0.1).requires_grad_()
    logp_old = logp_new.detach() + 0.1 * torch.randn(4, 3, generator=g)
    logp_ref = logp_new.detach() + 0.2 * torch.randn(4, 3, generator=g)
    mask = torch.arange(3)[None, :] < torch.tensor(lengths)[:, None]
    return logp_new, logp_old, logp_ref, torch.tensor([1.0, -1.0, 0.5, -0.5]), mask


def test_grpo_loss_types_agree_where_they_must():
    """dapo = bnpo on one batch; with equal lengths grpo = bnpo, and dr_grpo = bnpo * |o| / L."""
    args = _grpo_batch()
    bnpo = grpo_loss(*args, beta=0.1)  # the default, computed through ppo_clip_loss's mean
    assert grpo_loss(*args, beta=0.1, loss_type="dapo").item() == pytest.approx(bnpo.item(), rel=1e-6)
    assert grpo_loss(*args, beta=0.1, loss_type="grpo").item() == pytest.approx(bnpo.item(), rel=1e-6)
    dr = grpo_loss(*args, beta=0.1, loss_type="dr_grpo", max_completion_length=4)
    assert dr.item() == pytest.approx(bnpo.item() * 3 / 4, rel=1e-6)
    uneven = _grpo_batch(lengths=(1, 2, 3, 3))
    assert grpo_loss(*uneven, loss_type="grpo").item() != pytest.approx(grpo_loss(*uneven).item(), rel=1e-3)
    with pytest.raises(ValueError, match="loss_type must be one of"):
        grpo_loss(*args, loss_type="token")


def test_train_grpo_takes_the_bias_options_and_a_reward_function():
    problems = [(1, 1), (2, 3)]
    policy = _small_model()
    ref = frozen_copy(policy)
    history = train_grpo(policy, ref, problems, steps=3, prompts_per_step=2, group_size=4, scale_rewards="none",
                         loss_type="dr_grpo", eval_problems=problems, eval_every=2)
    assert history["eval_step"] == [0, 2] and len(history["len_right"]) == 3 and len(history["eval_kl"]) == 2
    # a constant reward gives zero advantages: with beta = 0 nothing moves
    still = _small_model()
    train_grpo(still, ref, problems, steps=2, prompts_per_step=2, group_size=4, beta=0.0,
               reward_fn=lambda seq: torch.ones(len(seq)))
    assert all(torch.equal(a, b) for a, b in zip(still.state_dict().values(), ref.state_dict().values()))
    with pytest.raises(ValueError, match="scale_rewards must be one of"):
        train_grpo(_small_model(), ref, problems, steps=1, scale_rewards="std")
    with pytest.raises(ValueError, match="loss_type must be one of"):
        train_grpo(_small_model(), ref, problems, steps=1, loss_type="mean")


def test_lengths_by_correctness_counts_tokens_with_the_end_mark():
    seq = torch.tensor([encode("7+8=15."), encode("7+8=9._"), encode("2+2=4._"), encode("2+2=+._")])
    assert lengths_by_correctness(seq) == (pytest.approx(2.5), pytest.approx(2.0))
    assert torch.isnan(torch.tensor(lengths_by_correctness(seq[1:2])[0]))


def test_expert_iteration_learns_from_the_accepted_samples():
    problems = [(1, 1), (2, 3)]
    policy = _small_model()
    ref = frozen_copy(policy)
    before, _ = evaluate(policy, ref, problems, samples_per_problem=64)
    history = expert_iteration(policy, ref, problems, rounds=2, samples_per_problem=400, steps=20, lr=3e-3,
                               batch_size=16, eval_problems=problems)
    assert history["round"] == [1, 2] and all(n > 0 for n in history["accepted"])
    assert history["reward"][-1] > before + 0.3 and history["kl"][-1] > 0
    with pytest.raises(ValueError, match="rounds"):
        expert_iteration(policy, ref, problems, rounds=0)
