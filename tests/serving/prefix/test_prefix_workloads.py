"""Prefix-sharing workloads and their replay through the block-hash cache and the radix tree."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from utils.attention.decode_cost import decode_step_cost, params_read_per_step
from utils.attention.kv_cache import MODELS
from utils.serving.prefix.prefix_workloads import (WORKLOADS, Request, agent_workload, chat_workload, few_shot_workload,
                                            prefill_cost, replay_block_cache, replay_radix_tree)
from tests.serving.prefix_reference import lcp


def brute_force_hits(requests):
    """Unbounded cache: the longest prefix of prompt[:-1] that any earlier prompt + output starts with."""
    return [max((lcp(r.prompt[:-1], q.prompt + q.output) for q in requests[:i]), default=0)
            for i, r in enumerate(requests)]


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workloads_are_seeded(name):
    make = WORKLOADS[name]
    assert make(seed=3) == make(seed=3)
    assert make(seed=3) != make(seed=4)


def test_chat_turns_resend_the_whole_conversation():
    requests = chat_workload(n_conversations=3, turns=4, system_tokens=10)
    assert len(requests) == 12
    assert len({r.prompt[:10] for r in requests}) == 1  # one system prompt
    extends = [any(r.prompt[:len(q.prompt) + len(q.output)] == q.prompt + q.output for q in requests[:i])
               for i, r in enumerate(requests)]
    # every turn but a conversation's first resends an earlier turn's prompt and reply
    assert extends.count(False) == 3


def test_few_shot_shares_the_instruction_only():
    requests = few_shot_workload(n_requests=5, instruction_tokens=100, question_tokens=(5, 5))
    assert all(r.prompt[:100] == requests[0].prompt[:100] and len(r.prompt) == 105 for r in requests)
    assert len({r.prompt for r in requests}) == 5


def test_agent_tree_has_branching_levels_and_parents_first():
    requests = agent_workload(n_tasks=2, depth=3, branching=3)
    assert len(requests) == 2 * (1 + 3 + 9)
    for i, r in enumerate(requests[2:], start=2):
        parents = [q for q in requests[:i] if r.prompt[:len(q.prompt) + len(q.output)] == q.prompt + q.output]
        assert parents, "a child request must extend an earlier trajectory"


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_unbounded_replays_equal_the_brute_force_longest_prefix(name):
    requests = WORKLOADS[name](seed=1)
    big = sum(len(r.prompt) + len(r.output) for r in requests)
    expected = brute_force_hits(requests)
    assert list(replay_radix_tree(requests, big).hit_tokens) == expected
    for block_size in (1, 16, 64):
        hits = replay_block_cache(requests, big, block_size).hit_tokens
        assert list(hits) == [h // block_size * block_size for h in expected]


small_requests = st.lists(
    st.builds(Request, st.lists(st.integers(0, 2), min_size=1, max_size=10).map(tuple),
              st.lists(st.integers(0, 2), max_size=4).map(tuple)), min_size=1, max_size=12)


@settings(max_examples=100, deadline=None)
@given(requests=small_requests, block_size=st.integers(1, 4), slack=st.integers(0, 20))
def test_hits_never_exceed_the_unbounded_longest_prefix(requests, block_size, slack):
    longest = max(len(r.prompt) + len(r.output) for r in requests)
    capacity = (-(-longest // block_size) + slack) * block_size
    bound = brute_force_hits(requests)
    for result in (replay_radix_tree(requests, capacity), replay_block_cache(requests, capacity, block_size)):
        assert all(0 <= h <= b for h, b in zip(result.hit_tokens, bound))
        assert result.prompt_tokens == tuple(len(r.prompt) for r in requests)


def test_eviction_lowers_the_hit_rate_of_chat():
    requests = chat_workload(seed=2)
    longest = max(len(r.prompt) + len(r.output) for r in requests)
    big = sum(len(r.prompt) + len(r.output) for r in requests)
    tight = -(-longest // 16) * 16
    assert replay_radix_tree(requests, tight).hit_rate < replay_radix_tree(requests, big).hit_rate
    assert replay_block_cache(requests, tight, 16).hit_rate < replay_block_cache(requests, big, 16).hit_rate


def test_replay_rejects_a_cache_smaller_than_a_request():
    requests = [Request((1, 2, 3, 4), (5,))]
    with pytest.raises(ValueError, match="cannot hold the longest request"):
        replay_radix_tree(requests, 4)
    with pytest.raises(ValueError, match="cannot hold the longest request"):
        replay_block_cache(requests, 5, 4)  # one block of 4 tokens, the request needs two
    with pytest.raises(ValueError, match="empty"):
        replay_radix_tree([], 10)
    with pytest.raises(ValueError, match="user_tokens"):
        chat_workload(user_tokens=(5, 2))


@pytest.mark.parametrize("n_new,n_cached", [(1, 0), (7, 0), (5, 9)])
def test_prefill_cost_is_the_sum_of_one_token_steps(n_new, n_cached):
    """Prefill of token i attends to i + 1 keys: the same FLOPs as decode steps with context i + 1."""
    model = "Llama-3-8B"
    n_params = params_read_per_step(model)
    expected = sum(decode_step_cost(n_params, MODELS[model], 1, i + 1).flops
                   for i in range(n_cached, n_cached + n_new))
    assert prefill_cost(model, n_new, n_cached).flops == pytest.approx(expected, rel=1e-12)
    weights = n_params * 2
    cache = MODELS[model].cache_bytes(n_cached + n_new)
    assert prefill_cost(model, n_new, n_cached).nbytes == weights + cache


def test_prefill_cost_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown model"):
        prefill_cost("GPT-5", 10)
    with pytest.raises(ValueError, match="n_new"):
        prefill_cost("Llama-3-8B", 0)
