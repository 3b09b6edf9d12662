import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.serving.runtime.engine import Engine

VOCAB, BLOCK = 64, 4


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TinyLlama(LlamaConfig(vocab=VOCAB, dim=32, n_layers=2, n_heads=4, n_kv_heads=2)).double().eval()


def workload(seed, n=10, shared_prefix=9):
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(0, VOCAB, (shared_prefix,), generator=g).tolist()
    requests = []
    for i in range(n):
        own = torch.randint(0, VOCAB, (int(torch.randint(1, 14, (1,), generator=g)),), generator=g).tolist()
        requests.append(((shared if i % 2 else []) + own, int(torch.randint(1, 12, (1,), generator=g))))
    return requests


def greedy(model, prompt, n):
    return model.generate(torch.tensor([prompt]), n)[0, len(prompt):].tolist()


def serve(model, requests, **kwargs):
    engine = Engine(model, **kwargs)
    ids = [engine.add_request(p, n) for p, n in requests]
    out = engine.run()
    assert engine.pool.num_free_blocks == engine.pool.num_blocks  # nothing leaked
    return [out[i] for i in ids], engine.stats()


@pytest.mark.parametrize("kwargs, expect", [
    (dict(num_blocks=64, block_size=BLOCK, max_num_batched_tokens=64), "plain"),
    (dict(num_blocks=64, block_size=BLOCK, max_num_batched_tokens=5), "chunked"),
    (dict(num_blocks=9, block_size=BLOCK, max_num_batched_tokens=16), "preempted"),
    (dict(num_blocks=12, block_size=BLOCK, max_num_batched_tokens=8, prefix_caching=True), "preempted+hits"),
    (dict(num_blocks=64, block_size=BLOCK, max_num_batched_tokens=64, prefix_caching=True), "hits"),
    (dict(num_blocks=64, block_size=BLOCK, max_num_batched_tokens=64, policy="static", max_num_seqs=4), "static"),
    (dict(num_blocks=64, block_size=BLOCK, max_num_batched_tokens=40, chunked_prefill=False), "unchunked"),
])
def test_outputs_equal_one_at_a_time_greedy(model, kwargs, expect):
    requests = workload(1)
    outputs, stats = serve(model, requests, **kwargs)
    assert outputs == [greedy(model, p, n) for p, n in requests]
    assert [len(o) for o in outputs] == [n for _, n in requests]
    if "preempted" in expect:
        assert stats.preemptions > 0
    if "hits" in expect:
        assert stats.prefix_hit_tokens >= BLOCK
    if expect == "chunked":
        assert max(stats.batched_tokens) <= 5


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), num_blocks=st.integers(8, 40), budget=st.integers(1, 24),
       prefix_caching=st.booleans())
def test_any_pool_and_budget_gives_the_greedy_tokens(model, seed, num_blocks, budget, prefix_caching):
    requests = [(p, n) for p, n in workload(seed, n=6) if len(p) + n - 1 <= num_blocks * BLOCK]
    outputs, _ = serve(model, requests, num_blocks=num_blocks, block_size=BLOCK,
                       max_num_batched_tokens=budget, prefix_caching=prefix_caching)
    assert outputs == [greedy(model, p, n) for p, n in requests]


def test_a_lone_request_takes_ceil_prompt_over_budget_steps_to_first_token(model):
    engine = Engine(model, num_blocks=16, block_size=BLOCK, max_num_batched_tokens=4)
    rid = engine.add_request(list(range(10)), 5)
    engine.run()
    s = engine.stats().requests[rid]
    assert s.ttft_steps == 3 and s.tpot_steps == 1 and s.output_tokens == 5
    assert s.ttft_seconds > 0


def test_continuous_batching_needs_fewer_steps_than_static(model):
    requests = [([1, 2, 3], 20)] + [([4, 5], 2)] * 6
    _, cont = serve(model, requests, num_blocks=64, block_size=BLOCK, max_num_batched_tokens=64, max_num_seqs=4)
    _, stat = serve(model, requests, num_blocks=64, block_size=BLOCK, max_num_batched_tokens=64, max_num_seqs=4,
                    policy="static")
    assert cont.steps < stat.steps


def test_prefix_hit_saves_the_shared_blocks(model):
    prefix = list(range(12))
    engine = Engine(model, num_blocks=32, block_size=BLOCK, max_num_batched_tokens=64, prefix_caching=True)
    first = engine.add_request(prefix + [20], 3)
    engine.run()
    second = engine.add_request(prefix + [30, 31], 3)
    engine.run()
    stats = engine.stats().requests
    assert stats[first].cached_tokens == 0 and stats[second].cached_tokens == 12


@pytest.mark.parametrize("prompt, n, match", [
    ([], 3, "empty"), ([1, 2], 0, "max_new_tokens"), (list(range(40)), 2, "whole cache holds 32"),
    ([VOCAB], 1, "lie in"),
])
def test_impossible_requests_are_refused(model, prompt, n, match):
    engine = Engine(model, num_blocks=8, block_size=BLOCK, max_num_batched_tokens=8)
    with pytest.raises(ValueError, match=match):
        engine.add_request(prompt, n)


def test_bad_engine_arguments(model):
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Engine(model, num_blocks=8, block_size=BLOCK, max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="policy"):
        Engine(model, num_blocks=8, block_size=BLOCK, max_num_batched_tokens=8, policy="fifo")
    with pytest.raises(ValueError, match="TinyLlama"):
        Engine(torch.nn.Linear(2, 2), num_blocks=8, block_size=BLOCK, max_num_batched_tokens=8)


def test_schedule_records_phases_and_preemptions(model):
    requests = workload(3)
    _, stats = serve(model, requests, num_blocks=9, block_size=BLOCK, max_num_batched_tokens=16)
    phases = [phase for record in stats.schedule for _, _, phase in record.chunks]
    assert {"prefill", "decode"} <= set(phases)
    assert sum(len(r.preempted) for r in stats.schedule) == stats.preemptions > 0
    decodes = sum(n for r in stats.schedule for _, n, phase in r.chunks if phase == "decode")
    assert decodes <= sum(n - 1 for _, n in requests)  # every decode step feeds back one generated token


@pytest.mark.parametrize("kv_format", ["int8", "fp8_e4m3"])
def test_a_quantised_cache_gives_the_same_tokens_whatever_the_batch(model, kv_format):
    # each key and value is quantised on its own (int8: its own scale; FP8: a fixed scale), so batching,
    # chunking, preemption and prefix hits cannot change what is stored: one request alone is the reference
    requests = workload(5)
    alone = [serve(model, [r], num_blocks=16, block_size=BLOCK, max_num_batched_tokens=64,
                   kv_format=kv_format)[0][0] for r in requests]
    together, stats = serve(model, requests, num_blocks=12, block_size=BLOCK, max_num_batched_tokens=8,
                            prefix_caching=True, kv_format=kv_format)
    assert stats.preemptions > 0 and stats.prefix_hit_tokens > 0
    assert together == alone


def test_a_request_that_fills_the_whole_cache_exactly_is_served(model):
    # 8 blocks of 4 hold 32 tokens. A 30-token prompt with 3 new tokens caches 30 + 3 - 1 = 32 (the last token
    # is returned, never fed back): it fits, and is served as greedy decoding; a fourth new token would need 33.
    prompt = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(5)).tolist()
    out, _ = serve(model, [(prompt, 3)], num_blocks=8, block_size=BLOCK, max_num_batched_tokens=8)
    assert out == [greedy(model, prompt, 3)]
    with pytest.raises(ValueError, match="needs 33 cached tokens"):
        Engine(model, num_blocks=8, block_size=BLOCK, max_num_batched_tokens=8).add_request(prompt, 4)
