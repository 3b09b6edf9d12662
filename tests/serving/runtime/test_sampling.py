"""Sampling in the serving engine: seeded per request, equal to one request alone, distributed as softmax(z / T)."""

import pytest
import torch

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.serving.runtime.engine import Engine
from utils.serving.runtime.sampling import draw, sample_reference
from utils.serving.speculation.goodness_of_fit import chi_square_critical, chi_square_statistic

VOCAB, BLOCK, STOP = 24, 4, 3


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TinyLlama(LlamaConfig(vocab=VOCAB, dim=32, n_layers=2, n_heads=4, n_kv_heads=2)).double().eval()


def _requests(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(0, VOCAB, (6,), generator=g).tolist()
    out = []
    for i in range(n):
        own = torch.randint(0, VOCAB, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist()
        out.append(((shared if i % 2 else []) + own, 8, [0.0, 0.7, 1.0, 1.5][i % 4], 100 + i))
    return out


@pytest.mark.parametrize("kwargs", [
    dict(num_blocks=64, block_size=BLOCK, max_num_batched_tokens=64, prefix_caching=True),
    dict(num_blocks=12, block_size=BLOCK, max_num_batched_tokens=7),  # chunked prefill and preemption
], ids=["batched", "chunked-and-preempted"])
def test_sampled_outputs_equal_one_request_alone_with_the_same_seed(model, kwargs):
    engine = Engine(model, **kwargs)
    requests = _requests()
    ids = [engine.add_request(p, n, temperature=t, seed=s, stop_token=STOP) for p, n, t, s in requests]
    out = engine.run()
    stopped = 0
    for i, (p, n, t, s) in zip(ids, requests):
        tokens, logps = sample_reference(model, p, n, t, s, STOP)
        assert out[i] == tokens, i
        stopped += tokens[-1] == STOP
        if t > 0:
            assert engine.output_logprobs(i) == pytest.approx(logps, abs=1e-10)
        else:
            assert engine.output_logprobs(i) == []
    if kwargs["num_blocks"] == 12:
        assert engine.stats().preemptions > 0
    assert engine.pool.num_free_blocks == engine.pool.num_blocks


def test_a_different_seed_gives_a_different_sample_and_the_same_seed_the_same(model):
    outs = []
    for seed in (1, 1, 2):
        engine = Engine(model, num_blocks=32, block_size=BLOCK, max_num_batched_tokens=64)
        rid = engine.add_request([5, 6, 7], 12, temperature=1.5, seed=seed)
        outs.append(engine.run()[rid])
    assert outs[0] == outs[1] != outs[2]


def _first_token_counts(model, prompt, temperature, n):
    engine = Engine(model, num_blocks=2 * n, block_size=BLOCK, max_num_batched_tokens=len(prompt) * n)
    ids = [engine.add_request(prompt, 1, temperature=temperature, seed=s) for s in range(n)]
    out = engine.run()
    return torch.bincount(torch.tensor([out[i][0] for i in ids]), minlength=VOCAB)


def test_engine_samples_follow_softmax_over_temperature_and_the_test_has_power(model):
    """1,500 first tokens at T = 0.5 pass a chi-square test at significance 1e-3 against softmax(z / 0.5) and
    fail it against softmax(z), what an engine that ignored the temperature would sample."""
    prompt = [1, 2, 3]
    logits = model(torch.tensor([prompt]))[0, -1].detach()
    counts = _first_token_counts(model, prompt, 0.5, 1500)
    stat, dof = chi_square_statistic(counts, torch.softmax(logits / 0.5, -1))
    assert stat < chi_square_critical(dof, 1e-3)
    stat, dof = chi_square_statistic(counts, torch.softmax(logits, -1))
    assert stat > chi_square_critical(dof, 1e-3)


def test_draw_is_inverse_cdf_and_greedy_at_zero():
    logits = torch.tensor([0.0, 1.0, 2.0])
    assert draw(logits, 0.0) == (2, pytest.approx(float(torch.log_softmax(logits, -1)[2])))
    g = torch.Generator().manual_seed(0)
    u = float(torch.rand((), generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    cdf = torch.softmax(logits.double(), -1).cumsum(0)
    assert draw(logits, 1.0, g)[0] == int((cdf <= u).sum())
    with pytest.raises(ValueError, match="one row"):
        draw(logits[None], 1.0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=-0.1), "temperature must be a finite number >= 0"),
    (dict(temperature=float("nan")), "temperature must be a finite number >= 0"),
    (dict(temperature=1.0, seed=-1), "seed must be None or an int >= 0"),
    (dict(stop_token=VOCAB), "stop_token must be None or a token id"),
])
def test_bad_sampling_parameters_are_refused(model, kwargs, match):
    engine = Engine(model, num_blocks=8, block_size=BLOCK, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match=match):
        engine.add_request([1, 2], 3, **kwargs)


def test_update_weights_copies_in_place_resets_the_prefix_cache_and_refuses_mid_batch(model):
    served = TinyLlama(model.config).double().eval()
    engine = Engine(served, num_blocks=16, block_size=BLOCK, max_num_batched_tokens=32, prefix_caching=True)
    rid = engine.add_request(list(range(9)), 2)
    engine.step()
    with pytest.raises(ValueError, match="update the weights between batches"):
        engine.update_weights(model.named_parameters())
    engine.run()
    assert engine.pool.num_cached_blocks == 2
    nbytes = engine.update_weights(model.named_parameters())
    assert nbytes == sum(p.numel() * 8 for p in model.parameters())
    assert engine.pool.num_cached_blocks == 0
    assert all(torch.equal(a, b) for a, b in zip(served.parameters(), model.parameters()))
    rid = engine.add_request([4, 5], 6)
    assert engine.run()[rid] == model.generate(torch.tensor([[4, 5]]), 6)[0, 2:].tolist()
    with pytest.raises(ValueError, match="parameters were not updated"):
        engine.update_weights(list(model.named_parameters())[:-1])
    with pytest.raises(ValueError, match="is not a parameter"):
        engine.update_weights([("nope", torch.zeros(1))])
