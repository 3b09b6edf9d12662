"""Tests of utils.capstone.engine_rollouts: GRPO's groups sampled by the serving engine, sharing their prompts."""

from __future__ import annotations

import pytest
import torch

from utils.attention.llama import TinyLlama
from utils.capstone.engine_rollouts import (
    CONFIG, engine_rollouts, expected_hit_rate, new_engine, to_sequence,
)
from utils.rl.tiny_lm import END, MAX_RESPONSE, PAD, all_prompts, prompt_tokens, response_mask, token_logprobs
from utils.serving.runtime.sampling import sample_reference


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(3)
    return TinyLlama(CONFIG).double().eval()


def test_rollouts_equal_one_request_alone_and_carry_the_trainers_log_probs(model):
    problems, group = all_prompts()[10:14], 8
    seeds = list(range(500, 500 + len(problems) * group))
    roll = engine_rollouts(new_engine(model, 64), problems, group, seeds)
    prompts = prompt_tokens(problems).tolist()
    for i, seed in enumerate(seeds):
        tokens, _ = sample_reference(model, prompts[i // group], MAX_RESPONSE, 1.0, seed, END)
        assert roll.sequences[i].tolist() == to_sequence(prompts[i // group], tokens), i
    mask = response_mask(roll.sequences)
    trainer = token_logprobs(model, roll.sequences).detach()
    torch.testing.assert_close(roll.logprobs[mask], trainer[mask], rtol=0, atol=1e-12)


@pytest.mark.parametrize("group", [1, 4, 8])
def test_siblings_hit_every_prompt_token_but_the_last(model, group):
    """A fresh engine: the first sample of each group computes its prompt, the G - 1 others find all but the
    last token in the cache: (G - 1)/G x 3/4 of the prompt tokens."""
    problems = all_prompts()[:6]
    roll = engine_rollouts(new_engine(model, 64), problems, group, list(range(len(problems) * group)))
    assert roll.cached_tokens == (group - 1) * 3 * len(problems)
    assert roll.hit_rate == pytest.approx(expected_hit_rate(group), abs=1e-12)
    without = engine_rollouts(new_engine(model, 64, prefix_caching=False), problems, group,
                              list(range(len(problems) * group)))
    assert without.cached_tokens == 0 and torch.equal(without.sequences, roll.sequences)


def test_a_sampled_padding_token_ends_the_response():
    assert to_sequence([1, 10, 2, 11], [3, PAD, 5]) == [1, 10, 2, 11, 3, PAD, PAD]
    assert to_sequence([1, 10, 2, 11], [3, END]) == [1, 10, 2, 11, 3, END, PAD]


def test_bad_rollout_requests_are_refused(model):
    engine = new_engine(model, 8)
    with pytest.raises(ValueError, match="one seed per sample: 8"):
        engine_rollouts(engine, all_prompts()[:2], 4, [0, 1])
    engine.add_request([1, 2], 2)
    with pytest.raises(ValueError, match="rollouts need it idle"):
        engine_rollouts(engine, all_prompts()[:1], 2, [0, 1])
