"""The engine's scheduler run without a model, each step priced on the roofline: serving at GPU scale on a CPU.

:class:`utils.serving.runtime.engine.Engine` computes real tokens, so it only runs a
tiny model. The scheduler alone (:class:`utils.serving.runtime.scheduler.Scheduler`)
never looks at token values unless prefix caching is on, and no request stops
early here (no end-of-sequence token), so its decisions for a trace are the
same whatever the model says. This module runs that same scheduler over a
trace of requests, appends a placeholder token where the engine would sample
one, and advances a clock by each step's roofline time
(:func:`utils.serving.costs.step_time.step_seconds` of the step's decodes and
prefill chunks) for a real model on a real GPU.

So the schedule is exactly the engine's (the tests hold them equal) and the
clock is a lower bound of what that GPU would take: activations, kernel
launches, sampling and the CPU's own scheduling time are left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from utils.serving.runtime.block_pool import BlockPool
from utils.serving.runtime.engine import StepRecord, chunk_phase
from utils.serving.costs.metrics import RequestTimes
from utils.serving.runtime.scheduler import Request, Scheduler
from utils.serving.costs.step_time import Roof, ServedModel, step_cost, step_seconds
from utils.serving.costs.trace import TimedRequest
from utils.validate import check_positive_int

__all__ = ["SimulatedRun", "simulate"]

PLACEHOLDER_TOKEN = 0


@dataclass(frozen=True)
class SimulatedRun:
    """Per-request token times (seconds on the roofline clock), the schedule and each step's duration."""

    requests: list[RequestTimes]
    schedule: list[StepRecord]
    step_seconds: list[float]
    preemptions: int

    @property
    def seconds(self) -> float:
        return max(r.token_times[-1] for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(len(r.token_times) for r in self.requests)


def simulate(trace: Sequence[TimedRequest], model: ServedModel, roof: Roof, num_blocks: int, block_size: int,
             max_num_batched_tokens: int, *, max_num_seqs: int | None = None, chunked_prefill: bool = True,
             policy: str = "continuous", prefix_caching: bool = False) -> SimulatedRun:
    """Serve ``trace`` (arrivals in seconds) with the engine's scheduler; each step lasts its roofline time.

    A step's decodes attend to their whole context (``start + 1`` tokens) and its prefill chunks are
    ``(new tokens, cached tokens)`` (:func:`utils.serving.costs.step_time.step_cost`). Requests that cannot fit even
    alone raise ``ValueError``, as in the engine.
    """
    check_positive_int("max_num_batched_tokens", max_num_batched_tokens)
    if any(b.arrival < a.arrival for a, b in zip(trace, trace[1:])):
        raise ValueError("the trace's arrivals must not decrease")
    capacity = num_blocks * block_size
    for r in trace:
        if len(r.prompt) + r.max_new_tokens - 1 > capacity:
            raise ValueError(f"a request of {len(r.prompt)} prompt and {r.max_new_tokens} new tokens cannot fit a "
                             f"cache of {capacity} tokens")
    scheduler = Scheduler(BlockPool(num_blocks, prefix_caching), block_size, max_num_batched_tokens, max_num_seqs,
                          chunked_prefill, policy)
    requests = [Request(i, list(r.prompt), r.max_new_tokens) for i, r in enumerate(trace)]
    times: list[list[float]] = [[] for _ in trace]
    schedule, durations, now, i, finished = [], [], 0.0, 0, 0
    while finished < len(trace):
        if not scheduler.running and not scheduler.waiting:
            now = max(now, trace[i].arrival)
        while i < len(trace) and trace[i].arrival <= now:
            scheduler.waiting.append(requests[i])
            i += 1
        chunks = scheduler.schedule()
        if not chunks:
            raise RuntimeError("no request could be scheduled although some are waiting")
        decodes, prefills, record = [], [], []
        for chunk in chunks:
            phase, start = chunk_phase(chunk), chunk.request.num_computed
            record.append((chunk.request.request_id, chunk.num_tokens, phase))
            if phase == "decode":
                decodes.append(start + 1)
            else:
                prefills.append((chunk.num_tokens, start))
        dt = step_seconds(step_cost(model, decodes, prefills), roof)
        now += dt
        durations.append(dt)
        schedule.append(StepRecord(tuple(record), tuple(scheduler.preempted_last)))
        for chunk in chunks:
            request = chunk.request
            scheduler.computed(request, chunk.num_tokens)
            if request.num_computed < request.num_tokens:
                continue
            request.output.append(PLACEHOLDER_TOKEN)
            times[request.request_id].append(now)
            if request.finished:
                scheduler.finish(request)
                finished += 1
    return SimulatedRun([RequestTimes(r.arrival, tuple(t)) for r, t in zip(trace, times)], schedule, durations,
                        scheduler.preemptions)
