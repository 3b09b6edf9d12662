"""A serving engine: continuous batching over a paged KV cache, chunked prefill, preemption, prefix caching.

Put together from this part's pieces, as vLLM's engine core is:
:class:`utils.serving.runtime.scheduler.Scheduler` decides each step's chunks,
:class:`utils.serving.runtime.block_pool.BlockPool` hands out KV blocks (and finds
cached prefixes), :func:`utils.serving.runtime.paged_forward.forward_segments` runs
the model once over all of the step's tokens, and sampling (greedy, or with a
temperature from the request's own seeded generator) appends a token to every
request whose known tokens are all computed.

Its contract: every request's output equals one-at-a-time decoding
(``TinyLlama.generate`` when greedy, :func:`utils.serving.runtime.sampling.sample_reference`
with the same seed when sampled) whatever the batch, the chunking, the
preemptions and the cache hits; in float64 that holds token for token. For
reinforcement learning it also returns each sampled token's log-prob and takes
new weights in place between batches (:meth:`Engine.update_weights`). A request is never
dropped; one that cannot fit even alone is refused when it is added.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from utils.attention.llama import TinyLlama
from utils.serving.runtime.block_pool import BlockPool
from utils.serving.costs.metrics import RequestTimes
from utils.serving.runtime.paged_forward import DECODE_ATTENTION, KVBlocks, Segment, forward_segments
from utils.serving.runtime.sampling import check_sampling, draw, make_generator
from utils.serving.runtime.scheduler import Request, ScheduledChunk, Scheduler
from utils.validate import check_positive_int

__all__ = ["Engine", "EngineStats", "RequestStats", "StepRecord", "chunk_phase"]


@dataclass(frozen=True)
class RequestStats:
    """One finished request: latencies in engine steps and in seconds, and what the prefix cache saved."""

    prompt_tokens: int
    output_tokens: int
    steps: RequestTimes
    seconds: RequestTimes
    cached_tokens: int
    preemptions: int

    @property
    def ttft_steps(self) -> float:
        return self.steps.ttft

    @property
    def tpot_steps(self) -> float | None:
        return self.steps.tpot

    @property
    def ttft_seconds(self) -> float:
        return self.seconds.ttft

    @property
    def tpot_seconds(self) -> float | None:
        return self.seconds.tpot


@dataclass(frozen=True)
class StepRecord:
    """What one step ran: ``(request id, tokens, "prefill" or "decode")`` per chunk, and whom it preempted."""

    chunks: tuple[tuple[int, int, str], ...]
    preempted: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n, _ in self.chunks)


@dataclass(frozen=True)
class EngineStats:
    """Per-request stats and the engine's totals."""

    requests: dict[int, RequestStats]
    steps: int
    seconds: float
    schedule: list[StepRecord]
    """What each step ran."""
    preemptions: int

    @property
    def batched_tokens(self) -> list[int]:
        """Tokens run in each step (prefill chunks plus decodes)."""
        return [record.num_tokens for record in self.schedule]

    @property
    def prefix_hit_tokens(self) -> int:
        return sum(r.cached_tokens for r in self.requests.values())

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests.values())


def chunk_phase(chunk: ScheduledChunk) -> str:
    """``"decode"`` for the one newest token of a request past its prompt, else ``"prefill"`` (recompute included).

    Read before the step's tokens are counted as computed: the chunk starts at ``request.num_computed``.
    """
    request, newest = chunk.request, chunk.request.num_tokens - 1
    return "decode" if chunk.num_tokens == 1 and request.num_computed == newest >= len(request.prompt) else "prefill"


class Engine:
    """Greedy generation for many requests at once on ``model``, with ``num_blocks`` KV blocks of ``block_size``.

    ``max_num_batched_tokens`` is the token budget of one step. ``policy="static"`` admits a new batch only
    when the last one has finished (the baseline continuous batching replaces); ``max_num_seqs`` caps the
    requests running at once. ``kv_format`` (``"int8"`` or ``"fp8_e4m3"``) stores the KV cache quantised
    (:class:`utils.serving.runtime.paged_forward.KVBlocks`): outputs then follow the quantised model, not greedy
    ``generate``. ``clock`` gives the seconds recorded in :meth:`stats`.

    ``decode_attention`` is how a step's decodes attend (:func:`utils.serving.runtime.paged_forward.forward_segments`):
    ``"loop"`` request by request, ``"batched"`` in one call per layer (the Triton split-KV kernel on a GPU),
    or ``"auto"`` (the default): ``"batched"`` when the cache is on a GPU and not quantised, ``"loop"``
    otherwise. Greedy tokens are the same either way in float64; in lower precision the two round differently.
    """

    def __init__(self, model: TinyLlama, num_blocks: int, block_size: int, max_num_batched_tokens: int,
                 prefix_caching: bool = False, *, max_num_seqs: int | None = None, chunked_prefill: bool = True,
                 policy: str = "continuous", kv_dtype: torch.dtype | None = None, kv_format: str | None = None,
                 clock: Callable[[], float] = time.perf_counter, decode_attention: str = "auto") -> None:
        if not isinstance(model, TinyLlama):
            raise ValueError(f"model must be a utils.attention.llama.TinyLlama, got {type(model).__name__}")
        check_positive_int("max_num_batched_tokens", max_num_batched_tokens)
        if max_num_seqs is not None:
            check_positive_int("max_num_seqs", max_num_seqs)
        self.model = model.eval()
        self.kv = KVBlocks(model, num_blocks, block_size, kv_dtype, kv_format)
        if decode_attention not in ("auto", *DECODE_ATTENTION):
            raise ValueError(f"decode_attention must be 'auto' or one of {DECODE_ATTENTION}, got {decode_attention!r}")
        self.decode_attention = decode_attention if decode_attention != "auto" else \
            "batched" if self.kv.k.is_cuda and kv_format is None else "loop"
        self.pool = BlockPool(num_blocks, prefix_caching)
        self.scheduler = Scheduler(self.pool, block_size, max_num_batched_tokens, max_num_seqs,
                                   chunked_prefill, policy)
        self.clock = clock
        self._start = clock()
        self._requests: dict[int, Request] = {}
        self._arrival: dict[int, tuple[int, float]] = {}
        self._token_times: dict[int, list[tuple[int, float]]] = {}
        self._finished: set[int] = set()
        self._steps = 0
        self._schedule: list[StepRecord] = []
        self._samplers: dict[int, tuple[float, torch.Generator | None]] = {}
        self._logprobs: dict[int, list[float]] = {}

    @property
    def elapsed_seconds(self) -> float:
        """Seconds on ``clock`` since the engine was made."""
        return self.clock() - self._start

    @property
    def capacity_tokens(self) -> int:
        return self.kv.num_blocks * self.kv.block_size

    def add_request(self, prompt: list[int], max_new_tokens: int, *, arrival: float | None = None,
                    temperature: float = 0.0, seed: int | None = None, stop_token: int | None = None) -> int:
        """Queue a request for up to ``max_new_tokens`` tokens after ``prompt``; returns its id.

        ``arrival`` is when the request arrived, in seconds since the engine started (default: now); a replay
        that adds requests between steps passes their true arrival so that TTFT counts the wait for the step.
        ``temperature`` 0 (the default) is greedy; above 0 each token is drawn from ``softmax(logits / T)`` with
        the request's own generator, seeded by ``seed`` (:func:`utils.serving.runtime.sampling.draw`), so that the
        output does not depend on the batch. ``stop_token`` ends the request when produced.
        """
        check_positive_int("max_new_tokens", max_new_tokens)
        check_sampling(temperature, seed, stop_token, self.model.config.vocab)
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("prompt is empty: a request needs at least one token")
        vocab = self.model.config.vocab
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"prompt tokens must lie in [0, {vocab}), got min {min(prompt)}, max {max(prompt)}")
        needed = len(prompt) + max_new_tokens - 1  # the last token is returned, never fed back
        if needed > self.capacity_tokens:
            raise ValueError(f"a prompt of {len(prompt)} tokens with max_new_tokens={max_new_tokens} needs "
                             f"{needed} cached tokens, but the whole cache holds {self.capacity_tokens} "
                             f"({self.kv.num_blocks} blocks of {self.kv.block_size})")
        if not self.scheduler.chunked_prefill and needed > self.scheduler.max_num_batched_tokens:
            raise ValueError(f"without chunked prefill a request's {needed} tokens must fit one step's budget "
                             f"of {self.scheduler.max_num_batched_tokens}")
        request_id = len(self._requests)
        request = Request(request_id, prompt, max_new_tokens, stop_token=stop_token)
        self._requests[request_id] = request
        if temperature > 0:
            self._samplers[request_id] = (float(temperature), make_generator(seed))
        self._logprobs[request_id] = []
        now = self.clock() - self._start
        if arrival is not None and not 0 <= arrival <= now:
            raise ValueError(f"arrival must lie between the engine's start (0) and now ({now:.3f} s), got {arrival}")
        self._arrival[request_id] = (self._steps, now if arrival is None else arrival)
        self._token_times[request_id] = []
        self.scheduler.waiting.append(request)
        return request_id

    def has_unfinished(self) -> bool:
        return len(self._finished) < len(self._requests)

    def step(self) -> list[int]:
        """One scheduler iteration: schedule, run the model once, sample. Returns the ids that finished."""
        chunks = self.scheduler.schedule()
        if not chunks:
            if self.scheduler.waiting:
                raise RuntimeError("no request could be scheduled although some are waiting")
            return []
        segments = [Segment(tuple(c.request.tokens[c.request.num_computed:c.request.num_computed + c.num_tokens]),
                            c.request.num_computed, tuple(c.request.blocks)) for c in chunks]
        logits = forward_segments(self.model, self.kv, segments, self.decode_attention)
        greedy = logits.argmax(-1).tolist()  # one copy to the host for the whole step
        self._steps += 1
        now = self.clock() - self._start
        self._schedule.append(StepRecord(
            tuple((c.request.request_id, c.num_tokens, chunk_phase(c)) for c in chunks),
            tuple(self.scheduler.preempted_last)))
        done = []
        for row, (chunk, token) in enumerate(zip(chunks, greedy)):
            request = chunk.request
            self.scheduler.computed(request, chunk.num_tokens)
            if request.num_computed < request.num_tokens:
                continue  # a prompt chunk: no token yet
            sampler = self._samplers.get(request.request_id)
            if sampler is not None:
                token, logprob = draw(logits[row], *sampler)
                self._logprobs[request.request_id].append(logprob)
            request.output.append(token)
            self._token_times[request.request_id].append((self._steps, now))
            if request.finished:
                self.scheduler.finish(request)
                self._finished.add(request.request_id)
                done.append(request.request_id)
        return done

    def run(self) -> dict[int, list[int]]:
        """Step until every request has finished; the output tokens of each request id."""
        while self.has_unfinished():
            self.step()
        return {i: list(r.output) for i, r in self._requests.items()}

    def output_logprobs(self, request_id: int) -> list[float]:
        """The temperature-1 log-probs of a sampled request's output tokens (empty for a greedy one)."""
        if request_id not in self._logprobs:
            raise ValueError(f"no request {request_id}; ids run from 0 to {len(self._requests) - 1}")
        return list(self._logprobs[request_id])

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix (:meth:`utils.serving.runtime.block_pool.BlockPool.reset_prefix_cache`)."""
        return self.pool.reset_prefix_cache()

    @torch.no_grad()
    def update_weights(self, named_tensors) -> int:
        """Copy new weights into the served model in place, then drop the prefix cache; returns the bytes copied.

        ``named_tensors`` yields ``(name, tensor)`` pairs with the model's parameter names (a trainer's
        ``named_parameters()``, or tensors received from it). Only between batches: a request in flight
        would mix keys and values of two policies. Every parameter must be given exactly once.
        """
        if self.has_unfinished():
            raise ValueError("requests are still running: update the weights between batches")
        params = dict(self.model.named_parameters())
        seen, nbytes = set(), 0
        for name, tensor in named_tensors:
            if name not in params:
                raise ValueError(f"{name!r} is not a parameter of the served model")
            if name in seen:
                raise ValueError(f"{name!r} was given twice")
            if tuple(tensor.shape) != tuple(params[name].shape):
                raise ValueError(f"{name!r} has shape {tuple(tensor.shape)}, the model's is {tuple(params[name].shape)}")
            params[name].copy_(tensor)
            seen.add(name)
            nbytes += params[name].numel() * params[name].element_size()
        missing = sorted(set(params) - seen)
        if missing:
            raise ValueError(f"{len(missing)} parameters were not updated, first {missing[0]!r}")
        self.reset_prefix_cache()
        return nbytes

    def stats(self) -> EngineStats:
        """Per-request TTFT and TPOT in steps and seconds (finished requests), and the prefix-cache hits."""
        per_request = {}
        for i in sorted(self._finished):
            r, (arrival_step, arrival_s), times = self._requests[i], self._arrival[i], self._token_times[i]
            per_request[i] = RequestStats(
                prompt_tokens=len(r.prompt), output_tokens=len(r.output),
                steps=RequestTimes(arrival_step, tuple(float(s) for s, _ in times)),
                seconds=RequestTimes(arrival_s, tuple(t for _, t in times)),
                cached_tokens=r.cached_tokens, preemptions=r.preemptions)
        return EngineStats(per_request, self._steps, self.clock() - self._start, list(self._schedule),
                           self.scheduler.preemptions)
