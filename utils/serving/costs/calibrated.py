"""Calibrated serving predictions: the roofline times of :mod:`step_time`, divided by what real engines reach.

:mod:`~utils.serving.costs.step_time` prices a step on the datasheet roof: a
**bound** that no engine reaches. Held against published measurements (the
scorecard's ``step_time`` rows), engines land at 0.2 to 0.8 of it. A reader
planning a deployment wants a number to expect, so this module divides each
phase's roofline time by the fraction of the roof engines were measured to
reach in that phase (:data:`ACHIEVED`), fitted on the scorecard's ``fit`` rows
only (:func:`fit_achieved`):

- **prefill**: a compute-bound step; engines batch prompts up to
  :data:`PREFILL_TOKENS` tokens per step (TensorRT-LLM's and vLLM's default
  ``max_num_tokens`` is 8,192), so each request pays its share of such a step;
- **throughput-bound decode** (batch above :data:`LATENCY_BATCH`): reading the
  KV caches and the weights once per step; what is lost is bandwidth below peak
  and the kernels between the matmuls;
- **latency-bound decode** (batch up to :data:`LATENCY_BATCH`): the weights read
  once for a handful of tokens, where launches, sampling and the scheduler,
  which do not shrink with the batch, weigh most.

Continuous batching at steady state (:func:`continuous`) runs ``B`` sequences,
``B`` the concurrency, capped by the KV memory (a fraction of what the weights
leave, as TensorRT-LLM's ``kv_cache_free_gpu_mem_fraction``) and by the
engine's largest batch. Each request needs one prefill and ``O - 1`` decode
steps shared with ``B - 1`` others, so requests finish at
:func:`~utils.serving.costs.step_time.colocated_request_rate`, output tokens
flow at ``O`` times that, and a request waits ``(t (O - 1) + B P) / (O - 1)``
between its tokens on average (its own decode steps, and the others' prefills
that interrupt them).

What stays out: tensor parallelism's all-reduces (TP is priced as ``n``
times one GPU's roof), prefill chunks sharing a step with decodes (priced
apart, so a little pessimistic), queueing (TTFT is the prefill alone), and
any speculative decoding. A fraction fitted on one engine, model and GPU is a
calibration, not a mechanism: the scorecard page shows where it carries over
and where it does not.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence

from utils.serving.costs import step_time
from utils.serving.costs.step_time import Generation, Roof, ServedModel
from utils.validate import check_positive, check_positive_int

LATENCY_BATCH = 8
"""Decode batches up to this size are latency-bound: the scorecard's measured fraction falls there."""

PREFILL_TOKENS = 8192
"""Prompt tokens an engine prefills in one step (TensorRT-LLM's and vLLM's default ``max_num_tokens``)."""


class Achieved(NamedTuple):
    """The fraction of each phase's roofline time that engines reach (1 = the roof itself)."""

    prefill: float
    decode: float
    latency_decode: float

    def check(self) -> "Achieved":
        for name, value in self._asdict().items():
            if not (isinstance(value, (int, float)) and 0 < value <= 1):
                raise ValueError(f"achieved.{name} must be a fraction in (0, 1], got {value!r}")
        return self


ACHIEVED = Achieved(prefill=0.54, decode=0.73, latency_decode=0.59)
"""Fitted by :func:`fit_achieved` on the scorecard's ``serving_calibrated`` fit rows: TensorRT-LLM 1.0's
Llama 3.1 8B FP8 column on one H100 (prefill, decode) and NIM 1.8.0's Llama 3.3 70B FP8 TP 2 at
concurrency 1 (latency-bound decode); see ``tests/test_scorecard.py``."""

ROOF = Achieved(1.0, 1.0, 1.0)
"""The roofline itself: every function here with ``achieved=ROOF`` returns the bound."""


def _resolve(achieved: Achieved | None) -> Achieved:
    """``achieved``, or :data:`ACHIEVED` as it is when called (so a refit constant moves every caller)."""
    return (ACHIEVED if achieved is None else achieved).check()


def decode_fraction(batch: int, achieved: Achieved | None = None) -> float:
    """The fraction of the roof a decode step of ``batch`` sequences reaches: latency- or throughput-bound."""
    achieved = _resolve(achieved)
    return achieved.latency_decode if check_positive_int("batch", batch) <= LATENCY_BATCH else achieved.decode


def prefill_share_seconds(model: ServedModel, prompt_len: int, roof: Roof, achieved: Achieved | None = None) -> float:
    """One request's share of a prefill step of up to :data:`PREFILL_TOKENS` tokens, over ``achieved.prefill``.

    ``k = max(1, PREFILL_TOKENS // prompt_len)`` prompts share the step, so the
    weights are read once for all ``k``; a prompt longer than the step is priced
    as one step of its own length.
    """
    k = max(1, PREFILL_TOKENS // check_positive_int("prompt_len", prompt_len))
    return step_time.prefill_seconds(model, prompt_len, roof, batch=k) / k / _resolve(achieved).prefill


def kv_batch_limit(model: ServedModel, hbm_bytes: float, context: int, kv_memory_fraction: float = 0.9) -> int:
    """Sequences of ``context`` tokens whose caches fit in ``kv_memory_fraction`` of what the weights leave."""
    check_positive_int("context", context)
    if not 0 < kv_memory_fraction <= 1:
        raise ValueError(f"kv_memory_fraction must be in (0, 1], got {kv_memory_fraction!r}")
    free = check_positive("hbm_bytes", hbm_bytes, finite=True) - model.resident_bytes
    if free <= 0:
        raise ValueError(f"the weights ({model.resident_bytes / 1e9:.1f} GB) do not fit in {hbm_bytes / 1e9:.1f} GB")
    return int(kv_memory_fraction * free // (model.kv_bytes_per_token * context))


class ServingPoint(NamedTuple):
    """Continuous batching at steady state: the batch it runs and what a client sees.

    ``tokens_per_s``: output tokens per second of all requests together;
    ``itl``: the mean gap between a request's tokens; ``ttft``: the prefill
    alone (no queue); ``step_seconds``: one decode step at the mean context.
    """

    batch: int
    step_seconds: float
    ttft: float
    itl: float
    tokens_per_s: float


def continuous(model: ServedModel, roof: Roof, hbm_bytes: float, prompt_len: int, output_len: int,
               concurrency: int | None = None, achieved: Achieved | None = None, kv_memory_fraction: float = 0.9,
               max_batch: int = 2048) -> ServingPoint:
    """Steady-state continuous batching of requests of ``prompt_len`` in, ``output_len`` out.

    The batch is ``min(concurrency, KV limit, max_batch)`` (``concurrency=None``:
    as many as fit, an offline maximum-throughput run). A decode step attends to
    the mean context ``prompt_len + output_len // 2``; ``hbm_bytes`` is the
    memory of all the GPUs that share the model.
    """
    check_positive_int("output_len", output_len)
    achieved = _resolve(achieved)
    limit = min(kv_batch_limit(model, hbm_bytes, prompt_len + output_len, kv_memory_fraction),
                check_positive_int("max_batch", max_batch))
    if limit == 0:
        raise ValueError(f"not one sequence of {prompt_len + output_len} tokens fits beside the weights")
    batch = limit if concurrency is None else min(check_positive_int("concurrency", concurrency), limit)
    context = prompt_len + output_len // 2
    step = step_time.decode_step_seconds(model, batch, context, roof) / decode_fraction(batch, achieved)
    prefill = prefill_share_seconds(model, prompt_len, roof, achieved)
    rate = step_time.colocated_request_rate(batch, step, prefill, output_len)
    itl = (step * (output_len - 1) + batch * prefill) / (output_len - 1) if output_len > 1 else math.inf
    return ServingPoint(batch, step, prefill, itl, rate * output_len)


def static_batch(model: ServedModel, roof: Roof, batch: int, prompt_len: int, output_len: int,
                 achieved: Achieved | None = None) -> Generation:
    """:func:`~utils.serving.costs.step_time.serve_batch` with each phase over its achieved fraction.

    The ``batch`` prompts are prefilled together (one step, as in ``serve_batch``), then decoded together.
    """
    check_positive_int("output_len", output_len)
    achieved = _resolve(achieved)
    ttft = step_time.prefill_seconds(model, prompt_len, roof, batch) / achieved.prefill
    fraction = decode_fraction(batch, achieved)
    steps = [step_time.decode_step_seconds(model, batch, prompt_len + j, roof) / fraction
             for j in range(1, output_len)]
    tpot = sum(steps) / len(steps) if steps else 0.0
    e2e = ttft + sum(steps)
    return Generation(batch, ttft, tpot, e2e, batch * output_len / e2e, batch / tpot if steps else math.inf)


def fit_achieved(predict: Callable[[Achieved], Sequence[float]], published: Sequence[float],
                 step: float = 0.01) -> Achieved:
    """The :class:`Achieved` that minimises the squared log error of ``predict(achieved)`` against ``published``.

    ``predict`` maps candidate fractions to one prediction per fit row (each row
    reads the fractions of its own phases, so a field no row reads stays at
    1). Coordinate descent on a grid of ``step`` over (0, 1], one field at a
    time, until no field moves: the error is a sum of convex functions of each
    fraction's logarithm along every coordinate, so the sweep settles.
    """
    published = [check_positive("a published value", p, finite=True) for p in published]
    if not published:
        raise ValueError("fit_achieved needs at least one published value")
    grid = [round(step * i, 10) for i in range(1, int(round(1 / step)) + 1)]

    def loss(a: Achieved) -> float:
        predicted = predict(a)
        if len(predicted) != len(published):
            raise ValueError(f"predict returned {len(predicted)} values for {len(published)} published ones")
        return sum(math.log(p / q) ** 2 for p, q in zip(predicted, published))

    best = ROOF
    best_loss = loss(best)
    for _ in range(20):
        moved = False
        for field in Achieved._fields:
            for value in grid:
                candidate = best._replace(**{field: value})
                value_loss = loss(candidate)
                if value_loss < best_loss - 1e-12:
                    best, best_loss, moved = candidate, value_loss, True
        if not moved:
            return best
    return best
