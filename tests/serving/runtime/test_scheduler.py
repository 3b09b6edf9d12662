import pytest

from utils.serving.runtime.block_pool import BlockPool
from utils.serving.runtime.scheduler import Request, Scheduler


def make(num_blocks=8, budget=8, **kwargs):
    return Scheduler(BlockPool(num_blocks, kwargs.pop("prefix_caching", False)), 4, budget, **kwargs)


def run_step(s, chunks, sample=7):
    for c in chunks:
        s.computed(c.request, c.num_tokens)
        if c.request.num_computed == len(c.request.tokens):
            c.request.output.append(sample)
            if c.request.finished:
                s.finish(c.request)


def test_decodes_first_then_prompt_chunks_within_the_budget():
    s = make(budget=6)
    a, b = Request(0, [1] * 3, 5), Request(1, [2] * 10, 5)
    s.waiting.extend([a, b])
    first = s.schedule()
    assert [(c.request.request_id, c.num_tokens) for c in first] == [(0, 3), (1, 3)]
    run_step(s, first)
    second = s.schedule()  # a decodes one token, b's prompt goes on in a chunk of 5
    assert [(c.request.request_id, c.num_tokens) for c in second] == [(0, 1), (1, 5)]


def test_without_chunking_a_prompt_waits_for_a_whole_budget():
    s = make(budget=6, chunked_prefill=False)
    s.waiting.extend([Request(0, [1] * 3, 5), Request(1, [2] * 5, 5)])
    assert [c.num_tokens for c in s.schedule()] == [3]


def test_admission_stops_when_blocks_run_out_first_come_first_served():
    s = make(num_blocks=3, budget=64)
    s.waiting.extend([Request(0, [1] * 8, 2), Request(1, [2] * 8, 2), Request(2, [3], 2)])
    chunks = s.schedule()
    assert [c.request.request_id for c in chunks] == [0]  # request 2 would fit, but may not jump the queue
    assert len(s.waiting) == 2


def test_preemption_evicts_the_latest_admitted_and_requeues_it_first():
    s = make(num_blocks=2, budget=64)
    a, b = Request(0, [1] * 4, 3), Request(1, [2] * 4, 3)
    s.waiting.extend([a, b])
    run_step(s, s.schedule())  # both prefilled: one full block each, one output token each
    chunks = s.schedule()  # a needs a second block: b is preempted
    assert [c.request.request_id for c in chunks] == [0]
    assert list(s.waiting) == [b] and b.num_computed == 0 and b.output == [7] and b.preemptions == 1


def test_static_policy_admits_only_into_an_empty_batch():
    s = make(budget=64, policy="static", max_num_seqs=1)
    s.waiting.extend([Request(0, [1], 2), Request(1, [2], 2)])
    assert [c.request.request_id for c in s.schedule()] == [0]
    with pytest.raises(ValueError, match="policy"):
        make(policy="lifo")


def test_a_budget_used_up_exactly_leaves_the_next_request_waiting():
    # budget 8: a's 8-token prompt takes all of it; b waits, neither admitted with an empty chunk nor given a
    # token the budget does not have. Next step a's decode (1 token) leaves 7: b's 3-token prompt, then c's 4.
    s = make(budget=8)
    a, b, c = Request(0, [1] * 8, 3), Request(1, [2] * 3, 3), Request(2, [3] * 4, 3)
    s.waiting.extend([a, b, c])
    first = s.schedule()
    assert [(ch.request.request_id, ch.num_tokens) for ch in first] == [(0, 8)]
    assert list(s.waiting) == [b, c] and s.running == [a]
    run_step(s, first)
    second = s.schedule()
    assert [(ch.request.request_id, ch.num_tokens) for ch in second] == [(0, 1), (1, 3), (2, 4)]
    assert sum(ch.num_tokens for ch in second) == 8 and not s.waiting
