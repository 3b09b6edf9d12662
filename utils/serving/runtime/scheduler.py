"""Iteration-level scheduling: which requests run in the next step, and how many of their tokens.

The policy of vLLM's v1 scheduler, reduced to its ideas (Kwon et al. 2023,
arXiv:2309.06180, section 4.5; vLLM docs, "Optimization and Tuning"):

- **Continuous batching** (Orca, Yu et al., OSDI '22): the batch is formed
  anew every step; a finished request leaves and a waiting one joins at
  once, instead of the whole batch waiting for its longest member (*static*
  batching, kept here as ``policy="static"`` to compare against).
- **A token budget per step** (``max_num_batched_tokens``): running requests
  are served first, one token each when decoding; what is left of the budget
  goes to prompts. A prompt longer than what is left is cut into chunks over
  several steps: **chunked prefill** (Sarathi-Serve, Agrawal et al., OSDI '24),
  so no step carries an unbounded prefill and decoding requests keep their
  pace. With ``chunked_prefill=False`` a prompt waits until the whole of it
  fits in one step's budget.
- **Admission by free blocks**: a waiting request joins only if the pool has
  the blocks its scheduled tokens need (after any prefix-cache hits), first
  come first served; no request jumps the queue.
- **Preemption by recompute**: when a running request needs a block and the
  pool is empty, the most recently admitted running request is evicted, its
  blocks freed, and it goes back to the head of the queue with its generated
  tokens kept. It is later prefilled again over prompt + output (cheap if its
  blocks are still in the prefix cache). vLLM's older engine could also swap
  blocks to CPU memory; its v1 engine recomputes only.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from utils.serving.runtime.block_pool import BlockPool
from utils.serving.runtime.prefix_hash import ROOT_HASH, BlockHash, block_hashes

__all__ = ["POLICIES", "Request", "ScheduledChunk", "Scheduler"]

POLICIES = ("continuous", "static")


@dataclass(eq=False)
class Request:
    """One request's tokens and progress: ``num_computed`` of ``prompt + output`` have K/V in ``blocks``.

    Requests compare by identity (``eq=False``): the scheduler's ``in`` and ``remove`` on its running list
    would otherwise compare whole prompts, for every pair of running requests, every step.
    """

    request_id: int
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = field(default_factory=list)
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    hashes: list[BlockHash] = field(default_factory=list)
    """Chained hashes of the full blocks computed so far (prefix caching)."""
    cached_tokens: int = 0
    """Tokens whose K/V came from the prefix cache instead of being computed, over all admissions."""
    preemptions: int = 0
    stop_token: int | None = None
    """A token that ends the request as soon as it is produced (an end-of-sequence mark), or None."""

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def num_tokens(self) -> int:
        """``len(self.tokens)``, without building the list (the scheduler asks every step)."""
        return len(self.prompt) + len(self.output)

    @property
    def finished(self) -> bool:
        return len(self.output) >= self.max_new_tokens or (
            self.stop_token is not None and bool(self.output) and self.output[-1] == self.stop_token)


@dataclass(frozen=True)
class ScheduledChunk:
    """``num_tokens`` tokens of ``request``, from position ``request.num_computed``, run in this step."""

    request: Request
    num_tokens: int


class Scheduler:
    """Waiting and running queues over a :class:`BlockPool` of blocks of ``block_size`` tokens."""

    def __init__(self, pool: BlockPool, block_size: int, max_num_batched_tokens: int,
                 max_num_seqs: int | None = None, chunked_prefill: bool = True,
                 policy: str = "continuous") -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.pool, self.block_size = pool, block_size
        self.max_num_batched_tokens, self.max_num_seqs = max_num_batched_tokens, max_num_seqs
        self.chunked_prefill, self.policy = chunked_prefill, policy
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0
        self.preempted_last: list[int] = []
        """Ids of the requests the last :meth:`schedule` preempted, in order."""

    def _blocks_needed(self, request: Request, num_tokens: int) -> int:
        return -(-(request.num_computed + num_tokens) // self.block_size) - len(request.blocks)

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.pool.free(request.blocks)
        request.blocks, request.hashes, request.num_computed = [], [], 0
        request.preemptions += 1
        self.preemptions += 1
        self.preempted_last.append(request.request_id)
        self.waiting.appendleft(request)

    def _take_cached_prefix(self, request: Request) -> None:
        """Reuse cached blocks of the request's prefix, leaving at least one token to compute (for logits)."""
        if not self.pool.prefix_caching:  # nothing can hit: skip hashing the prompt
            request.blocks, request.hashes, request.num_computed = [], [], 0
            return
        tokens = request.tokens
        usable = (len(tokens) - 1) // self.block_size
        hashes = block_hashes(tokens[:usable * self.block_size], self.block_size)
        hits = self.pool.lookup(hashes)
        request.blocks, request.hashes = hits, hashes[:len(hits)]
        request.num_computed = len(hits) * self.block_size
        request.cached_tokens += request.num_computed

    def _release_cached_prefix(self, request: Request) -> None:
        request.cached_tokens -= request.num_computed
        self.pool.free(request.blocks)
        request.blocks, request.hashes, request.num_computed = [], [], 0

    def schedule(self) -> list[ScheduledChunk]:
        """The chunks of the next step; blocks for them are allocated, preempting if the pool runs out."""
        budget, chunks, preempted = self.max_num_batched_tokens, [], False
        self.preempted_last = []
        for request in list(self.running):
            if request not in self.running or budget == 0:
                continue
            n = min(request.num_tokens - request.num_computed, budget)
            while self._blocks_needed(request, n) > self.pool.num_free_blocks:
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is request:
                    break
            if request not in self.running:
                continue
            needed = self._blocks_needed(request, n)
            if needed:  # a decode inside its last block needs none
                request.blocks += self.pool.allocate(needed)
            chunks.append(ScheduledChunk(request, n))
            budget -= n
        if preempted or (self.policy == "static" and self.running):
            return chunks
        while self.waiting and budget > 0:
            if self.max_num_seqs is not None and len(self.running) >= self.max_num_seqs:
                break
            request = self.waiting[0]
            self._take_cached_prefix(request)
            remaining = request.num_tokens - request.num_computed
            n = min(remaining, budget)
            if (n < remaining and not self.chunked_prefill) or self._blocks_needed(request, n) > self.pool.num_free_blocks:
                self._release_cached_prefix(request)
                break
            self.waiting.popleft()
            request.blocks += self.pool.allocate(self._blocks_needed(request, n))
            self.running.append(request)
            chunks.append(ScheduledChunk(request, n))
            budget -= n
        return chunks

    def computed(self, request: Request, num_tokens: int) -> None:
        """Record that ``num_tokens`` more tokens have K/V; register newly full blocks in the prefix cache."""
        request.num_computed += num_tokens
        full = request.num_computed // self.block_size
        if self.pool.prefix_caching and full > len(request.hashes):
            start = len(request.hashes) * self.block_size
            parent = request.hashes[-1] if request.hashes else ROOT_HASH
            new = block_hashes(request.tokens[start:full * self.block_size], self.block_size, parent)
            for block, h in zip(request.blocks[len(request.hashes):full], new):
                self.pool.register(block, h)
            request.hashes += new

    def finish(self, request: Request) -> None:
        """Remove a finished request and free its blocks (cached ones stay findable until evicted)."""
        self.running.remove(request)
        self.pool.free(request.blocks)
        request.blocks = []
