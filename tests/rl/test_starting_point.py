"""utils.rl.starting_point: the labs' pre-trained and SFT models, trained once, are the recipe's models."""

from __future__ import annotations

import torch

from utils.rl.lora import count_trainable
from utils.rl.starting_point import pretrained_lm, sft_lm
from utils.rl.tiny_lm import TinyLM, arithmetic_corpus, train_lm
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
