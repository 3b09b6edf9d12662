"""Request traces: Poisson arrivals, and replaying them through an engine in steps or in seconds.

Serving benchmarks (vLLM's ``benchmark_serving.py``, DistServe, Sarathi-Serve)
send requests at the times of a Poisson process of rate ``lambda``: the gaps
between arrivals are independent and exponential with mean ``1 / lambda``.
Prompt and output lengths are drawn per request.

Two clocks replay a trace:

- :func:`replay_in_steps` counts time in engine steps (arrivals at step
  indices). Nothing in it depends on the machine, so its TTFT and TPOT in
  steps are the same on every CPU; a step of a real engine lasts longer
  when it carries more tokens, which this clock ignores.
- :func:`replay_in_seconds` sends requests at wall-clock times while the
  engine runs, as a benchmark client does; its figures are honest for the
  machine that ran them, and no other.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from utils.validate import check_positive, check_positive_int

__all__ = ["TimedRequest", "poisson_trace", "replay_in_seconds", "replay_in_steps"]


@dataclass(frozen=True)
class TimedRequest:
    """A request of a trace: its arrival time (steps or seconds), prompt tokens and output length."""

    arrival: float
    prompt: tuple[int, ...]
    max_new_tokens: int


def _check_range(name: str, bounds: tuple[int, int]) -> None:
    lo, hi = bounds
    if not 1 <= lo <= hi:
        raise ValueError(f"{name} must be (low, high) with 1 <= low <= high, got {bounds}")


def poisson_trace(n_requests: int, rate: float, prompt_len: tuple[int, int], output_len: tuple[int, int],
                  vocab: int, seed: int = 0) -> list[TimedRequest]:
    """``n_requests`` with exponential gaps of mean ``1 / rate``; lengths uniform in the inclusive ranges."""
    check_positive_int("n_requests", n_requests)
    check_positive("rate", rate, finite=True)
    check_positive_int("vocab", vocab)
    _check_range("prompt_len", prompt_len)
    _check_range("output_len", output_len)
    g = torch.Generator().manual_seed(seed)
    # Inverse transform, -ln(1 - u) / rate, in Python floats: the same gaps on every CPU (a vectorised sampler
    # may differ in the last bits between instruction sets).
    gaps = [-math.log1p(-u) / rate for u in torch.rand(n_requests, dtype=torch.float64, generator=g).tolist()]
    arrivals = [0.0] + list(itertools.accumulate(gaps[1:]))  # the first request arrives at 0
    trace = []
    for arrival in arrivals:
        n_prompt = int(torch.randint(prompt_len[0], prompt_len[1] + 1, (1,), generator=g))
        n_out = int(torch.randint(output_len[0], output_len[1] + 1, (1,), generator=g))
        prompt = tuple(torch.randint(0, vocab, (n_prompt,), generator=g).tolist())
        trace.append(TimedRequest(arrival, prompt, n_out))
    return trace


def _check_sorted(trace: Sequence[TimedRequest]) -> None:
    if any(b.arrival < a.arrival for a, b in zip(trace, trace[1:])):
        raise ValueError("the trace's arrivals must not decrease")


def replay_in_steps(engine, trace: Sequence[TimedRequest]) -> list[int]:
    """Run ``engine`` with request ``i`` added before step ``ceil(trace[i].arrival)``; the request ids, in order.

    When the engine is idle, time jumps to the next arrival (an idle engine runs no steps).
    """
    _check_sorted(trace)
    ids, step, i = [], 0, 0
    while i < len(trace) or engine.has_unfinished():
        if not engine.has_unfinished() and i < len(trace):
            step = max(step, -int(-trace[i].arrival // 1))
        while i < len(trace) and trace[i].arrival <= step:
            ids.append(engine.add_request(list(trace[i].prompt), trace[i].max_new_tokens))
            i += 1
        engine.step()
        step += 1
    return ids


def replay_in_seconds(engine, trace: Sequence[TimedRequest],
                      sleep: Callable[[float], None] = time.sleep) -> list[int]:
    """Run ``engine``, adding each request once ``engine.elapsed_seconds`` passes its arrival (in seconds).

    A request that arrives during a step is added after it, with its true arrival time, so its TTFT includes
    the wait. When the engine is idle the replay sleeps until the next arrival. Returns the request ids.
    """
    _check_sorted(trace)
    ids, i = [], 0
    while i < len(trace) or engine.has_unfinished():
        now = engine.elapsed_seconds
        if not engine.has_unfinished() and i < len(trace) and trace[i].arrival > now:
            sleep(trace[i].arrival - now)
            now = engine.elapsed_seconds
        while i < len(trace) and trace[i].arrival <= now:
            ids.append(engine.add_request(list(trace[i].prompt), trace[i].max_new_tokens,
                                          arrival=trace[i].arrival))
            i += 1
        if engine.has_unfinished():
            engine.step()
    return ids
