"""utils.rl.starting_point: the labs' pre-trained, SFT and GRPO models, trained once, are the recipe's models."""

from __future__ import annotations

import copy

import torch

from utils.rl.lora import apply_lora, count_trainable
from utils.rl.post_training import frozen_copy, train_grpo
from utils.rl.starting_point import LORA_TARGETS, grpo_lm, pretrained_lm, sft_lm
from utils.rl.tiny_lm import TinyLM, all_prompts, arithmetic_corpus, train_lm
from utils.train_once import CACHE_VARIABLE


def _same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_pretrained_lm_is_the_recipe_and_loads_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path))
    model, losses = pretrained_lm(n_sequences=64, steps=3, batch_size=8)
    recipe = TinyLM(seed=0)
    recipe_losses = train_lm(recipe, arithmetic_corpus(64, noise=0.5, seed=0), steps=3, lr=3e-3, batch_size=8, seed=0)
    assert _same(model, recipe) and losses == recipe_losses
    again, _ = pretrained_lm(n_sequences=64, steps=3, batch_size=8)
    assert _same(again, model)


def test_sft_lm_adapts_a_copy_of_the_pretrained_model(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VARIABLE, "off")
    monkeypatch.setattr("utils.rl.starting_point.pretrained_lm", lambda: (TinyLM(seed=0), []))
    base, sft = sft_lm(steps=2, n_demonstrations=32, batch_size=8)
    assert _same(base, TinyLM(seed=0))  # SFT trained a copy, not the base
    assert 0 < count_trainable(sft) < sum(p.numel() for p in sft.parameters())
    _, again = sft_lm(steps=2, n_demonstrations=32, batch_size=8)
    assert _same(sft, again)
    # the recipe as the labs and benchmarks/post_training_frontier.sft_model write it: adapt right after TinyLM(seed=0)
    recipe = apply_lora(copy.deepcopy(TinyLM(seed=0)), rank=4, alpha=8.0, targets=LORA_TARGETS)
    train_lm(recipe, arithmetic_corpus(32, noise=0.0, seed=1, problems=all_prompts()[::2]), steps=2, lr=1e-3,
             batch_size=8, response_only=True, seed=1)
    assert _same(sft, recipe)


def test_grpo_lm_is_train_grpo_on_a_copy_of_the_sft_model(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path))
    sft = TinyLM(seed=3)  # a little trained, so that some samples are right and GRPO has a signal
    train_lm(sft, arithmetic_corpus(2000, noise=0.0, seed=0), steps=40, lr=1e-2, batch_size=32, seed=0)
    monkeypatch.setattr("utils.rl.starting_point.sft_lm", lambda: (TinyLM(seed=0), copy.deepcopy(sft)))
    policy, history = grpo_lm(steps=2, prompts_per_step=4, group_size=4)
    recipe = copy.deepcopy(sft)
    recipe_history = train_grpo(recipe, frozen_copy(sft), all_prompts(), steps=2, prompts_per_step=4, group_size=4,
                                lr=3e-3, beta=0.04, clip=0.2, inner_epochs=2, seed=0)
    assert _same(policy, recipe) and not _same(policy, sft)
    assert history["reward"] == recipe_history["reward"] and history["kl"] == recipe_history["kl"]
    again, _ = grpo_lm(steps=2, prompts_per_step=4, group_size=4)
    assert _same(again, policy)
