"""utils.train_once: one training per key, a key that moves with the code and the arguments, no stale model."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import torch
from torch import nn

from utils import train_once as train_once_module
from utils.attention.llama import LlamaConfig
from utils.serving.speculation.tiny_corpus import train_tiny_llama
from utils.train_once import CACHE_VARIABLE, cache_key, source_digest, train_once

TINY = LlamaConfig(vocab=64, dim=16, n_layers=1, n_heads=2, n_kv_heads=2, ffn_hidden=32)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "trained"
    monkeypatch.setenv(CACHE_VARIABLE, str(folder))
    return folder


def _fit(width: int = 4, steps: int = 3, marker: str = "") -> nn.Linear:
    """A stand-in training: a few SGD steps of a linear layer from torch's global generator."""
    if marker:
        with open(marker, "a") as handle:
            handle.write("trained\n")
    layer = nn.Linear(width, 1)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    for _ in range(steps):
        x = torch.randn(8, width)
        loss = (layer(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return layer


fit = train_once(_fit)


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_second_call_loads_the_first_ones_model(cache, tmp_path):
    marker = tmp_path / "calls.txt"
    first, second = fit(marker=str(marker)), fit(marker=str(marker))
    assert marker.read_text().count("trained") == 1
    assert _same(first, second) and first is not second
    assert len(list(cache.glob("*.pt"))) == 1
    assert _same(first, fit.uncached(marker=str(marker)))  # the cached model is the one training gives


def test_other_arguments_train_again(cache, tmp_path):
    marker = tmp_path / "calls.txt"
    a, b = fit(steps=3, marker=str(marker)), fit(steps=4, marker=str(marker))
    assert marker.read_text().count("trained") == 2 and not _same(a, b)
    assert fit.cache_key(steps=3) == cache_key(_fit, 4, 3) != fit.cache_key(steps=4)  # defaults applied


def test_the_key_moves_with_the_code_threads_and_arguments(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "train.py").write_text("STEPS = 1\n")
    before = source_digest(package)
    (package / "train.py").write_text("STEPS = 2\n")
    assert source_digest(package) != before  # an edit of any module of the package gives a new key
    key = cache_key(_fit)
    monkeypatch.setattr(train_once_module, "source_digest", lambda: "edited")
    assert cache_key(_fit) != key
    monkeypatch.undo()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert cache_key(_fit) != key  # a CPU training's last digits depend on the thread count
    finally:
        torch.set_num_threads(threads)
    assert cache_key(_fit) == key
    assert cache_key(_fit, width=4.0) != key  # 4.0 is not 4
    corpus = torch.arange(6)
    assert cache_key(train_tiny_llama, TINY, corpus=corpus) != cache_key(train_tiny_llama, TINY, corpus=corpus + 1)


def test_the_callers_random_state_is_left_as_it_was(cache):
    for _ in range(2):  # a miss, then a hit
        torch.manual_seed(123)
        fit(steps=2)
        after = torch.rand(3)
        torch.manual_seed(123)
        assert torch.equal(after, torch.rand(3))


def test_the_result_does_not_depend_on_what_the_caller_drew(monkeypatch):
    monkeypatch.setenv(CACHE_VARIABLE, "off")
    torch.manual_seed(1)
    a = fit()
    torch.manual_seed(2)
    assert _same(a, fit())


def test_off_trains_every_time_and_stores_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_VARIABLE, "off")
    marker = tmp_path / "calls.txt"
    fit(marker=str(marker)), fit(marker=str(marker))
    assert marker.read_text().count("trained") == 2


def test_arguments_the_cache_cannot_key_are_refused(cache):
    with pytest.raises(TypeError, match="argument width is a object"):
        fit(width=object())


def test_a_damaged_entry_is_trained_again(cache, tmp_path):
    marker = tmp_path / "calls.txt"
    good = fit(marker=str(marker))
    (entry,) = cache.glob("*.pt")
    entry.write_bytes(b"not a checkpoint")
    assert _same(good, fit(marker=str(marker)))
    assert marker.read_text().count("trained") == 2


def _fit_in_process(folder: str, marker: str) -> None:
    import os

    os.environ[CACHE_VARIABLE] = folder
    fit(marker=marker)


def test_two_processes_asking_at_once_train_once(cache, tmp_path):
    marker = tmp_path / "calls.txt"
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_fit_in_process, args=(str(cache), str(marker))) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0, 0]
    assert marker.read_text().count("trained") == 1


def test_the_book_models_loaded_from_the_cache_are_the_trained_ones(cache):
    """What part 5's pages load is bitwise what ``train_tiny_llama`` trains (here on a small config)."""
    trained = train_tiny_llama.uncached(TINY, steps=3)
    assert _same(train_tiny_llama(TINY, steps=3), trained)  # a miss: trains, stores, loads
    assert _same(train_tiny_llama(TINY, steps=3), trained)  # a hit: loads
    assert not _same(train_tiny_llama(TINY, steps=4), trained)
    assert train_tiny_llama(TINY, steps=3).training is False


def test_the_folder_keeps_the_most_recently_used_entries(cache, monkeypatch):
    monkeypatch.setattr(train_once_module, "MAX_ENTRIES", 2)
    first = fit(steps=1)
    time.sleep(0.05)  # file times are only as fine as the kernel's clock tick
    fit(steps=2)
    time.sleep(0.05)
    fit(steps=1)  # a hit: steps=1 becomes the most recently used
    time.sleep(0.05)
    fit(steps=3)  # stores a third entry: steps=2, the least recently used, goes
    assert len(list(cache.glob("*.pt"))) == 2
    assert any(fit.cache_key(steps=1)[:32] in p.name for p in cache.glob("*.pt"))
    assert not any(fit.cache_key(steps=2)[:32] in p.name for p in cache.glob("*.pt"))
    assert _same(first, fit(steps=1))
