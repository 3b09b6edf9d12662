"""Tests of utils.capstone.grpo_engine and async_rl: GRPO with the engine's rollouts learns, on and off policy."""

from __future__ import annotations

import pytest
import torch

from utils.attention.llama import TinyLlama
from utils.capstone import async_rl
from utils.capstone.engine_rollouts import CONFIG, to_sequence
from utils.capstone.grpo_engine import Settings, tis_grpo_loss, train
from utils.rl.post_training import grpo_loss
from utils.rl.tiny_lm import END, MAX_RESPONSE, all_prompts, prompt_tokens
from utils.serving.runtime.sampling import sample_reference


def _batch(seed=0, n=16, t=3):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(n, t, generator=g, dtype=torch.float64)
    logp_new = (logp_old + 0.3 * torch.randn(n, t, generator=g, dtype=torch.float64)).requires_grad_()
    logp_ref = logp_old + 0.1 * torch.randn(n, t, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    mask = torch.rand(n, t, generator=g) < 0.8
    return logp_new, logp_old, logp_ref, adv, mask


def test_on_policy_tis_loss_is_part_4s_grpo_loss():
    logp_new, logp_old, logp_ref, adv, mask = _batch()
    ours = tis_grpo_loss(logp_new, logp_old, logp_ref, logp_old, adv, mask)
    torch.testing.assert_close(ours, grpo_loss(logp_new, logp_old, logp_ref, adv, mask), rtol=1e-12, atol=1e-12)


def test_stale_tokens_are_weighted_by_the_truncated_ratio():
    """With mu below pi_old the weight is pi_old / mu, capped: the surrogate's gradient scales by exactly that."""
    logp_new, logp_old, logp_ref, adv, mask = _batch(1)
    behaviour = logp_old - torch.log(torch.tensor(1.5, dtype=torch.float64))
    behaviour[0] = logp_old[0] - 3.0  # ratio e^3 > cap 2: truncated
    grad = lambda b: torch.autograd.grad(tis_grpo_loss(logp_new, logp_old, logp_ref, b, adv, mask, beta=0.0),
                                         logp_new)[0]
    on, off = grad(logp_old), grad(behaviour)
    torch.testing.assert_close(off[1:], 1.5 * on[1:])
    torch.testing.assert_close(off[0], 2.0 * on[0])


@pytest.mark.parametrize("off_policy", [False, True], ids=["on-policy", "one-step-off"])
def test_grpo_with_the_engine_learns_the_task(off_policy):
    """20 steps of 16 prompts x 8 samples from the pre-trained model (accuracy about 0.5 at temperature 1): the
    accuracy on all 100 problems ends above 0.6 (over three seeds the benchmark's runs reach 0.65 to 0.83 at
    step 20). Off-policy every batch after the first is one version stale and its ratios are not all 1."""
    _, h = train(seed=0, off_policy=off_policy, settings=Settings(steps=20, eval_every=20))
    assert h.accuracy[0] < 0.55 and h.accuracy[-1] > 0.6, h.accuracy
    assert h.staleness == ([0] + [1] * 19 if off_policy else [0] * 20)
    if off_policy:
        assert max(h.ratio_max) > 1.01
    else:
        assert max(h.ratio_max) == pytest.approx(1.0, abs=1e-9)
    assert len(set(h.sync_bytes)) == 1 and h.sync_bytes[0] == sum(p.numel() * 8 for p in TinyLlama(CONFIG).parameters())


@pytest.mark.parametrize("mode", async_rl.MODES)
def test_weights_sent_over_gloo_make_the_engine_sample_what_the_trainer_would(mode):
    trainer, engine = async_rl.run(mode, Settings(steps=4))
    params = sum(p.numel() * 8 for p in TinyLlama(CONFIG).parameters())
    assert trainer.sync_bytes == engine.sync_bytes == params
    assert trainer.staleness == ([0, 1, 1, 1] if mode == "async" else [0] * 4)
    model = TinyLlama(CONFIG).double()
    model.load_state_dict(trainer.check["policy"])
    prompt = prompt_tokens([all_prompts()[17]])[0].tolist()
    expected = [to_sequence(prompt, sample_reference(model.eval(), prompt, MAX_RESPONSE, 1.0, s, END)[0])
                for s in engine.check["seeds"]]
    assert engine.check["sequences"].tolist() == expected


def test_bad_settings_and_modes_are_refused():
    with pytest.raises(ValueError, match="steps"):
        Settings(steps=0)
    with pytest.raises(ValueError, match="mode must be one of"):
        async_rl.run("later")
