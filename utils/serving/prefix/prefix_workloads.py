"""Request streams that share prefixes, replayed through a block-hash cache and a radix tree.

Three seeded workloads (token ids are random draws from ``vocab``, so two
prompts share a prefix only where the workload makes them share one):

- :func:`chat_workload`: multi-turn chat. Turn ``t`` of a conversation sends the
  whole conversation so far (system prompt, every earlier user message and
  reply, the new user message); conversations interleave in random order.
- :func:`few_shot_workload`: one long instruction with worked examples, then a
  short question that differs per request.
- :func:`agent_workload`: agent / tree-of-thought programs. Each request extends
  a trajectory (task, earlier thoughts and tool results) and branches: several
  continuations of one shared trajectory are explored, level by level.

A replay runs the requests one at a time and counts the prompt tokens a cache
serves, under a capacity in tokens with LRU eviction:

- :func:`replay_block_cache`: vLLM's automatic prefix caching,
  :class:`~utils.serving.runtime.block_pool.BlockPool` over
  :func:`~utils.serving.runtime.prefix_hash.block_hashes`: a hit is a run of *full*
  blocks, ``blocks x block_size`` tokens; a partial block is never shared;
- :func:`replay_radix_tree`: SGLang's RadixAttention,
  :class:`~utils.serving.prefix.radix_tree.RadixTree`, to the token.

Both cache a request's prompt *and* output once it finishes (the next chat turn
reuses the reply), and both look up at most ``len(prompt) - 1`` tokens: the last
prompt token must run to give the logits of the first output token (vLLM's
``max_cache_hit_length = num_tokens - 1`` in ``kv_cache_manager.py``).

:func:`prefill_cost` turns tokens into FLOPs and bytes (part 5's step model), so a hit
becomes saved prefill FLOPs and a lower bound on the TTFT it saves.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from utils.serving.runtime.block_pool import BlockPool
from utils.serving.runtime.prefix_hash import block_hashes
from utils.serving.prefix.radix_tree import RadixTree
from utils.serving.costs.step_time import StepCost, served_model, step_cost
from utils.validate import check_nonnegative_int, check_positive_int

__all__ = ["Request", "ReplayResult", "chat_workload", "few_shot_workload", "agent_workload", "WORKLOADS",
           "replay_block_cache", "replay_radix_tree", "prefill_cost"]


@dataclass(frozen=True)
class Request:
    """One request: the prompt it sends and the output it will generate (both token ids)."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]


def _check_range(name: str, lo_hi: tuple[int, int]) -> tuple[int, int]:
    lo, hi = lo_hi
    check_positive_int(f"{name}[0]", lo)
    check_positive_int(f"{name}[1]", hi)
    if lo > hi:
        raise ValueError(f"{name} must be (low, high) with low <= high, got {lo_hi}")
    return lo, hi


class _Tokens:
    def __init__(self, seed: int, vocab: int) -> None:
        check_nonnegative_int("seed", seed)
        check_positive_int("vocab", vocab)
        self.rng, self.vocab = random.Random(seed), vocab

    def run(self, lo_hi: tuple[int, int] | int) -> tuple[int, ...]:
        n = lo_hi if isinstance(lo_hi, int) else self.rng.randint(*lo_hi)
        return tuple(self.rng.randrange(self.vocab) for _ in range(n))


def chat_workload(n_conversations: int = 16, turns: int = 4, system_tokens: int = 300,
                  user_tokens: tuple[int, int] = (20, 150), reply_tokens: tuple[int, int] = (50, 300),
                  vocab: int = 32000, seed: int = 0) -> list[Request]:
    """Multi-turn chat: every conversation opens with the same system prompt; turn ``t`` resends all before it."""
    check_positive_int("n_conversations", n_conversations)
    check_positive_int("turns", turns)
    check_nonnegative_int("system_tokens", system_tokens)
    _check_range("user_tokens", user_tokens)
    _check_range("reply_tokens", reply_tokens)
    gen = _Tokens(seed, vocab)
    system = gen.run(system_tokens)
    history = [system] * n_conversations
    left = [turns] * n_conversations
    requests = []
    while any(left):
        c = gen.rng.choice([i for i, n in enumerate(left) if n])
        prompt = history[c] + gen.run(user_tokens)
        output = gen.run(reply_tokens)
        requests.append(Request(prompt, output))
        history[c] = prompt + output
        left[c] -= 1
    return requests


def few_shot_workload(n_requests: int = 64, instruction_tokens: int = 1500,
                      question_tokens: tuple[int, int] = (20, 80), answer_tokens: tuple[int, int] = (5, 30),
                      vocab: int = 32000, seed: int = 0) -> list[Request]:
    """Few-shot prompting: one shared instruction with examples, then a short question of each request's own."""
    check_positive_int("n_requests", n_requests)
    check_positive_int("instruction_tokens", instruction_tokens)
    _check_range("question_tokens", question_tokens)
    _check_range("answer_tokens", answer_tokens)
    gen = _Tokens(seed, vocab)
    shared = gen.run(instruction_tokens)
    return [Request(shared + gen.run(question_tokens), gen.run(answer_tokens)) for _ in range(n_requests)]


def agent_workload(n_tasks: int = 4, depth: int = 3, branching: int = 3, system_tokens: int = 400,
                   task_tokens: tuple[int, int] = (50, 200), thought_tokens: tuple[int, int] = (40, 150),
                   tool_tokens: tuple[int, int] = (20, 200), vocab: int = 32000, seed: int = 0) -> list[Request]:
    """Agent / tree-of-thought: trajectories that branch ``branching`` ways at each of ``depth`` levels.

    A task's root request sends the system prompt and the task and generates a thought. Each child
    request resends its parent's prompt and thought, plus a tool result of its own (a different
    observation per branch), and generates the next thought. Levels run in order across tasks, in
    random order within a level: a parent always finishes before its children arrive.
    """
    for name, value in (("n_tasks", n_tasks), ("depth", depth), ("branching", branching)):
        check_positive_int(name, value)
    check_nonnegative_int("system_tokens", system_tokens)
    for name, value in (("task_tokens", task_tokens), ("thought_tokens", thought_tokens),
                        ("tool_tokens", tool_tokens)):
        _check_range(name, value)
    gen = _Tokens(seed, vocab)
    system = gen.run(system_tokens)
    level = [Request(system + gen.run(task_tokens), gen.run(thought_tokens)) for _ in range(n_tasks)]
    requests = []
    for d in range(depth):
        gen.rng.shuffle(level)
        requests.extend(level)
        if d + 1 < depth:
            level = [Request(parent.prompt + parent.output + gen.run(tool_tokens), gen.run(thought_tokens))
                     for parent in level for _ in range(branching)]
    return requests


WORKLOADS = {"chat": chat_workload, "few-shot": few_shot_workload, "agent": agent_workload}
"""The three workload generators by name, each with defaults that give a few dozen requests."""


@dataclass(frozen=True)
class ReplayResult:
    """Prompt tokens sent, and those a cache served, per request and in all."""

    prompt_tokens: tuple[int, ...]
    hit_tokens: tuple[int, ...]

    @property
    def hit_rate(self) -> float:
        """Cached prompt tokens over all prompt tokens."""
        return sum(self.hit_tokens) / sum(self.prompt_tokens)


def _check_requests(requests: Sequence[Request], capacity_tokens: int) -> None:
    check_positive_int("capacity_tokens", capacity_tokens)
    if not requests:
        raise ValueError("requests must not be empty")
    longest = max(len(r.prompt) + len(r.output) for r in requests)
    if any(not r.prompt for r in requests):
        raise ValueError("every request needs a prompt of at least one token")
    if longest > capacity_tokens:
        raise ValueError(f"capacity_tokens={capacity_tokens} cannot hold the longest request ({longest} tokens "
                         f"of prompt and output); allowed: at least {longest}")


def replay_block_cache(requests: Sequence[Request], capacity_tokens: int, block_size: int) -> ReplayResult:
    """Hits of vLLM-style prefix caching: ``capacity_tokens // block_size`` blocks, LRU eviction of free ones.

    Per request: look up the chained hashes of the full blocks of ``prompt[:-1]``; the run of hits is
    reused; blocks for the rest of prompt and output are allocated (evicting the least recently freed
    cached blocks); every full block is registered under its hash; then the request frees its blocks
    (last to first), which stay cached until allocation takes them.
    """
    check_positive_int("block_size", block_size)
    _check_requests(requests, capacity_tokens)
    pool = BlockPool(capacity_tokens // block_size, prefix_caching=True)
    needed = max(-(-(len(r.prompt) + len(r.output)) // block_size) for r in requests)
    if needed > pool.num_blocks:
        raise ValueError(f"{pool.num_blocks} blocks of {block_size} tokens cannot hold the longest request "
                         f"({needed} blocks); raise capacity_tokens")
    hits = []
    for r in requests:
        sequence = r.prompt + r.output
        hashes = block_hashes(sequence, block_size)
        found = pool.lookup(hashes[:(len(r.prompt) - 1) // block_size])
        blocks = found + pool.allocate(-(-len(sequence) // block_size) - len(found))
        for block, h in zip(blocks, hashes):
            pool.register(block, h)
        pool.free(blocks)
        hits.append(len(found) * block_size)
    return ReplayResult(tuple(len(r.prompt) for r in requests), tuple(hits))


def replay_radix_tree(requests: Sequence[Request], capacity_tokens: int) -> ReplayResult:
    """Hits of SGLang-style RadixAttention: longest cached prefix of ``prompt[:-1]``, to the token.

    Per request: match, then insert prompt and output (evicting LRU leaves to stay under the capacity).
    """
    _check_requests(requests, capacity_tokens)
    tree = RadixTree(capacity_tokens)
    hits = []
    for r in requests:
        hits.append(tree.match_prefix(r.prompt[:-1]))
        tree.insert(r.prompt + r.output)
    return ReplayResult(tuple(len(r.prompt) for r in requests), tuple(hits))


def prefill_cost(model: str, n_new: int, n_cached: int = 0, bytes_per_elem: int = 2) -> StepCost:
    """FLOPs and HBM bytes of prefilling ``n_new`` tokens after ``n_cached`` cached ones, for ``model``.

    FLOPs ``= 2 N n + 4 L H d sum_{i=c}^{c+n-1} (i + 1) = 2 N n + 2 L H d [(c+n)(c+n+1) - c(c+1)]``:
    the matmuls (Kaplan et al. 2020, ``2N`` per token,
    ``N`` = :func:`~utils.attention.decode_cost.params_read_per_step`)
    and causal attention, token ``i`` against ``i + 1`` keys, as in :mod:`utils.attention.decode_cost`.
    Bytes ``= N b`` (the weights, once) ``+`` the KV cache of ``c + n`` tokens (the cached part read,
    the new part written). A cache hit of ``c`` tokens saves ``prefill_cost(m, c + n) - prefill_cost(m, n, c)``.
    This is part 5's one step model (:func:`utils.serving.costs.step_time.step_cost` of one prefill chunk),
    split into the weight matmuls and attention; :func:`utils.serving.costs.step_time.step_seconds` of it,
    the two kernels each on its roofline, is a lower bound on the prefill's time.
    Activations, norms and the LM head over the prompt are left out.
    """
    check_positive_int("n_new", n_new)
    check_nonnegative_int("n_cached", n_cached)
    return step_cost(served_model(model, bytes_per_elem, bytes_per_elem), prefill_chunks=[(n_new, n_cached)])
