"""Tests of utils.capstone.grpo_check: the lab's checks pass the references and name each planted mistake."""

from __future__ import annotations

import pytest
import torch

from utils.capstone import grpo_check as gc
from utils.capstone.grpo_engine import tis_grpo_loss
from utils.hints import CheckFailed
from utils.rl.objectives import kl_estimate
from utils.rl.tiny_lm import END, MAX_RESPONSE, PROMPT_LEN, prompt_tokens
from utils.serving.runtime.sampling import draw
from utils.serving.speculation.goodness_of_fit import chi_square_critical, chi_square_statistic


# --- draw and its mistakes ---------------------------------------------------------------------------------------

def _draw(logits, temperature, generator=None, *, scale=True, logp_at_t=False, exclusive=False, how="rand",
          right=True):
    row = logits.double()
    if temperature == 0:
        token = int(row.argmax())
    else:
        probs = torch.softmax(row / temperature if scale else row, -1)
        if how == "multinomial":
            token = int(torch.multinomial(probs, 1, generator=generator))
        else:
            u = torch.rand((), generator=generator, dtype=torch.float64 if how == "rand" else torch.float32).double()
            cdf = probs.cumsum(0) - (probs if exclusive else 0)
            token = min(int(torch.searchsorted(cdf, u, right=right)), row.numel() - 1)
    logp = torch.log_softmax(row / temperature if logp_at_t and temperature else row, -1)
    return token, float(logp[token])


def _no_greedy(logits, temperature, generator=None):
    return _draw(logits, max(temperature, 1.0), generator)


def test_the_reference_draw_passes_and_its_chi_square_test_has_room():
    result = gc.check_draw(draw)
    assert result["statistic"] < result["critical"]
    gc.check_draw(lambda z, t, g: _draw(z, t, g, right=False))  # right=False differs only when u equals a CDF value


@pytest.mark.parametrize("mistake, hint", [
    (dict(scale=False), "temperature ignored"),
    (dict(logp_at_t=True), "logprob at T"),
    (dict(how="multinomial"), "consumption"),
    (dict(how="rand32"), "consumption"),
    (dict(exclusive=True), "off by one"),
])
def test_a_planted_draw_mistake_gets_its_hint(mistake, hint):
    with pytest.raises(CheckFailed) as failed:
        gc.check_draw(lambda z, t, g: _draw(z, t, g, **mistake))
    assert failed.value.hint == gc.HINTS[hint]
    assert "Hint: " + gc.HINTS[hint] in str(failed.value)


def test_a_draw_that_samples_at_temperature_zero_or_returns_nothing_is_named():
    with pytest.raises(CheckFailed, match="argmax"):
        gc.check_draw(_no_greedy)
    with pytest.raises(CheckFailed, match="return a pair"):
        gc.check_draw(lambda z, t, g: None)


def test_the_chi_square_test_rejects_the_mutant_that_ignores_the_temperature():
    """The power the lab shows: 3,000 tokens from softmax(z) fail the test against softmax(z / 0.5) by far."""
    z = 1.5 * torch.randn(14, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.tensor([draw(z, 1.0, g)[0] for _ in range(3000)]), minlength=14)
    statistic, dof = chi_square_statistic(counts, torch.softmax(z / 0.5, -1))
    assert statistic > 10 * chi_square_critical(dof, 1e-3)


# --- the truncated-importance loss and its mistakes ---------------------------------------------------------------

def _loss(new, old, ref, behaviour, adv, mask, clip=0.2, beta=0.04, cap=2.0, *, detach=True, truncate=True,
          base="old", masked=True, kl_weighted=False, fixed_cap=False, inverted=False):
    mask = mask.bool() if masked else torch.ones_like(mask, dtype=torch.bool)
    w = torch.exp(behaviour - old) if inverted else torch.exp(old - behaviour)
    w = w.clamp(max=2.0 if fixed_cap else cap) if truncate else w
    w = w.detach() if detach else w
    ratio = torch.exp(new - (old if base == "old" else behaviour))
    if base != "old":
        w = torch.ones_like(w)
    a = adv[:, None].expand_as(ratio)
    surrogate = torch.minimum(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)
    kl = beta * kl_estimate(new, ref, "k3")
    per_token = w * (-surrogate + kl) if kl_weighted else -w * surrogate + kl
    return per_token[mask].mean()


def test_the_reference_loss_and_a_rewritten_one_pass():
    gc.check_tis_loss(tis_grpo_loss)
    gc.check_tis_loss(_loss)


@pytest.mark.parametrize("mistake, hint", [
    (dict(detach=False), "detach"),
    (dict(truncate=False), "truncate"),
    (dict(base="behaviour"), "behaviour ratio"),
    (dict(masked=False), "mask"),
    (dict(kl_weighted=True), "kl weighted"),
    (dict(fixed_cap=True), "cap"),
    (dict(inverted=True), "inverted"),
])
def test_a_planted_loss_mistake_gets_its_hint(mistake, hint):
    with pytest.raises(CheckFailed) as failed:
        gc.check_tis_loss(lambda *args: _loss(*args, **mistake))
    assert failed.value.hint == gc.HINTS[hint]


def test_a_loss_whose_value_is_right_but_gradient_is_not_is_named():
    def frozen_ratio(new, old, ref, behaviour, adv, mask, clip, beta, cap):
        return _loss(new.detach() + 0 * new, old, ref, behaviour, adv, mask, clip, 0.0, cap) + \
            beta * kl_estimate(new, ref, "k3")[mask.bool()].mean()
    with pytest.raises(CheckFailed, match="gradient is not"):
        gc.check_tis_loss(frozen_ratio)


# --- a group's rollouts and their mistakes ------------------------------------------------------------------------

def _rollouts(engine, problems, group_size, seeds, *, order="right", temperature=1.0, stop=END, answer="measured"):
    prompts = prompt_tokens(problems).tolist()
    ids = [None] * len(seeds)

    def add(i):
        ids[i] = engine.add_request(prompts[i // group_size], MAX_RESPONSE, temperature=temperature,
                                    seed=seeds[i] if temperature else None, stop_token=stop)

    firsts = range(0, len(seeds), group_size) if order != "one first" else [0]
    if order != "all at once":
        for i in firsts:
            add(i)
        engine.step()
    for i in range(len(seeds)):
        if ids[i] is None:
            add(i)
    out = engine.run()
    stats = engine.stats()
    rate = sum(stats.requests[r].cached_tokens for r in ids) / (PROMPT_LEN * len(ids))
    tokens = [out[r] for r in (sorted(ids) if order == "admission" else ids)]
    return tokens, rate if answer == "measured" else rate * len(problems)


def test_the_right_admission_order_passes_with_the_predicted_hit_rates():
    assert gc.check_group_rollouts(_rollouts) == [(8, pytest.approx(7 / 8 * 3 / 4, abs=1e-12)),
                                                  (4, pytest.approx(3 / 4 * 3 / 4, abs=1e-12))]


@pytest.mark.parametrize("mistake, hint", [
    (dict(order="all at once"), "same step"),
    (dict(order="one first"), "some groups"),
    (dict(order="admission"), "order"),
    (dict(temperature=0.0), "greedy rollouts"),
    (dict(stop=None), "stop token"),
    (dict(answer="scaled"), "hit rate"),
])
def test_a_planted_rollout_mistake_gets_its_hint(mistake, hint):
    with pytest.raises(CheckFailed) as failed:
        gc.check_group_rollouts(lambda *args: _rollouts(*args, **mistake))
    assert failed.value.hint == gc.HINTS[hint]


def test_bad_input_to_the_checks_is_refused():
    for check in (gc.check_draw, gc.check_tis_loss, gc.check_group_rollouts):
        with pytest.raises(ValueError, match="pass your function itself"):
            check("my_function")
    with pytest.raises(ValueError, match="model must be a utils.attention.llama.TinyLlama"):
        gc.check_group_rollouts(_rollouts, model=torch.nn.Linear(2, 2))
