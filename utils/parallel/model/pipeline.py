"""Pipeline-parallel schedules as a simulation: GPipe, 1F1B and interleaved 1F1B, their bubble and memory.

A model of ``p * v`` layer groups ("virtual stages") runs on ``p`` devices
("stages"); chunk ``c`` of stage ``s`` is virtual stage ``k = c * p + s``
(with ``v = 1`` chunk per stage, virtual stage = stage). A batch is cut into
``m`` micro-batches. Each stage runs forward (F) and backward (B) operations
in an order the schedule fixes; :func:`schedule` gives every operation a start
and an end time by simulating those orders under two rules:

- a stage runs one operation at a time, in its prescribed order;
- F of virtual stage ``k`` waits for F of ``k - 1`` (same micro-batch); B of ``k``
  waits for B of ``k + 1`` and for its own F. Communication is free.

The orders (:func:`stage_orders`):

- ``"gpipe"`` (Huang et al., "GPipe", NeurIPS 2019, arXiv:1811.06965): all m
  forwards, then all m backwards;
- ``"1f1b"`` (PipeDream-Flush; Narayanan et al., "Memory-Efficient
  Pipeline-Parallel DNN Training", ICML 2021, arXiv:2006.09503; and
  arXiv:2104.04473 section 2.2.1): ``p - s - 1`` warm-up forwards, then
  alternate one F and one B, then the remaining Bs;
- ``"interleaved"`` (Narayanan et al., "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", SC 2021, arXiv:2104.04473
  section 2.2.2): 1F1B over ``v`` chunks per stage, in the order of Megatron's
  ``forward_backward_pipelining_with_interleaving``; the paper needs ``m`` to
  be a multiple of ``p`` (section 2.2.2), Megatron-core relaxes it with a
  group size ``N`` of consecutive micro-batches per chunk (``p <= N <= m``;
  here ``N`` must divide ``m``). A chunk's F and B take ``t_forward / v`` and ``t_backward / v``.
  (When ``m == p`` Megatron runs every forward first; this module keeps the
  general warm-up count there too, which is still a valid schedule.)

The bubble (:func:`bubble_fraction`) is the idle share of ``p * makespan``.
With ``v = 1`` it is ``(p - 1) / (m + p - 1)``; the paper states the same as
``(p - 1) / m`` of the ideal time, and ``(1 / v)(p - 1) / m`` interleaved
(:func:`ideal_bubble_fraction`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple, Sequence

from utils.validate import check_positive, check_positive_int

KINDS = ("gpipe", "1f1b", "interleaved")


class Op(NamedTuple):
    """One forward (``kind="F"``) or backward (``"B"``) of one micro-batch on one chunk of one stage."""

    stage: int
    microbatch: int
    chunk: int
    kind: str
    start: float
    end: float


def _check(kind: str, n_stages: int, n_microbatches: int, n_chunks: int,
           group_size: int | None = None) -> tuple[int, int, int, int]:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    p = check_positive_int("n_stages", n_stages)
    m = check_positive_int("n_microbatches", n_microbatches)
    v = check_positive_int("n_chunks", n_chunks)
    if kind != "interleaved" and (v != 1 or group_size is not None):
        raise ValueError(f"n_chunks must be 1 and group_size None for kind={kind!r} "
                         f"(only 'interleaved' splits a stage), got {v} and {group_size}")
    n = p if group_size is None else check_positive_int("group_size", group_size)
    if kind == "interleaved":
        if group_size is None and m % p:
            raise ValueError(f"interleaved needs n_microbatches to be a multiple of n_stages ({p}), got {m}; "
                             "or pass group_size, Megatron-core's microbatch_group_size_per_vp_stage")
        if not p <= n <= m or m % n:
            raise ValueError(f"group_size must lie in [n_stages, n_microbatches] = [{p}, {m}] and divide "
                             f"n_microbatches, got {n}")
    return p, m, v, n


def stage_orders(kind: str, n_stages: int, n_microbatches: int, n_chunks: int = 1,
                 group_size: int | None = None) -> list[list[tuple[str, int, int]]]:
    """For each stage, its operations in the order it runs them, as ``(kind, chunk, microbatch)``.

    ``group_size`` (interleaved only; Megatron-core's ``microbatch_group_size_per_vp_stage``,
    Llama 3's N) is how many consecutive micro-batches go through one chunk
    before the stage moves to its next chunk: ``n_stages`` (the default) is
    Megatron's depth-first order, ``n_microbatches`` breadth-first (every
    micro-batch through chunk 0 first).
    """
    p, m, v, n = _check(kind, n_stages, n_microbatches, n_chunks, group_size)
    orders = []
    for s in range(p):
        if kind == "gpipe":
            order = [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
        elif kind == "1f1b":
            warmup = min(p - s - 1, m)
            order = [("F", 0, i) for i in range(warmup)]
            for i in range(m - warmup):
                order += [("F", 0, warmup + i), ("B", 0, i)]
            order += [("B", 0, i) for i in range(m - warmup, m)]
        else:
            total = m * v  # (chunk, micro-batch) pairs; Megatron's warm-up count for this rank:
            warmup = min((p - s - 1) * 2 + (v - 1) * n, total)

            def unit(k: int, forward: bool) -> tuple[int, int]:
                """Megatron's k-th forward (or backward) of a rank: (chunk, microbatch); groups of n per chunk."""
                chunk = (k % (n * v)) // n
                return (chunk if forward else v - 1 - chunk), (k // (n * v)) * n + k % n

            order = [("F", *unit(k, True)) for k in range(warmup)]
            for k in range(total - warmup):
                order += [("F", *unit(warmup + k, True)), ("B", *unit(k, False))]
            order += [("B", *unit(k, False)) for k in range(total - warmup, total)]
        orders.append(order)
    return orders


def schedule(kind: str, n_stages: int, n_microbatches: int, n_chunks: int = 1,
             t_forward: float = 1.0, t_backward: float = 2.0, group_size: int | None = None) -> list[Op]:
    """Simulate ``kind`` on ``n_stages`` stages and return every operation with its start and end.

    ``t_forward`` and ``t_backward`` are one micro-batch's F and B through a
    whole stage (any unit); interleaved chunks take ``1 / n_chunks`` of them.
    ``group_size`` as in :func:`stage_orders`. Operations come sorted by (start, stage).
    """
    p, m, v, n = _check(kind, n_stages, n_microbatches, n_chunks, group_size)
    duration = {"F": check_positive("t_forward", t_forward, finite=True) / v,
                "B": check_positive("t_backward", t_backward, finite=True) / v}
    return simulate(stage_orders(kind, p, m, v, group_size), duration, n_chunks=v, name=kind)


def _deps(op_kind: str, k: int, i: int, n_virtual: int) -> list[tuple[str, int, int]]:
    """What (kind, virtual stage, microbatch) must end before ``op_kind`` of virtual stage ``k``, microbatch ``i``.

    F waits for F of ``k - 1``; B for its own F and for B of ``k + 1``; W (the
    weight gradient, split off B by zero-bubble schedules) for its own B only.
    """
    if op_kind == "F":
        return [("F", k - 1, i)] if k > 0 else []
    if op_kind == "B":
        return [("F", k, i)] + ([("B", k + 1, i)] if k < n_virtual - 1 else [])
    return [("B", k, i)]


def simulate(orders: Sequence[Sequence[tuple[str, int, int]]], duration: dict[str, float],
             n_chunks: int = 1, name: str = "schedule") -> list[Op]:
    """Run per-stage orders of ``(kind, chunk, microbatch)`` under the two rules of the module docstring.

    ``duration`` maps each kind ("F", "B" and, for a split backward, "W") to
    its time on one chunk. Each stage starts an operation when it is free and
    the operation's inputs (:func:`_deps`) have ended. Returns the operations
    sorted by (start, stage); raises ``RuntimeError`` if the orders deadlock.
    """
    p = len(orders)
    n_virtual = p * n_chunks
    done: dict[tuple[str, int, int], float] = {}  # (kind, virtual stage, microbatch) -> end time
    free = [0.0] * p
    position = [0] * p
    ops: list[Op] = []
    while any(position[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while position[s] < len(orders[s]):
                op_kind, c, i = orders[s][position[s]]
                k = c * p + s
                deps = _deps(op_kind, k, i, n_virtual)
                if any(d not in done for d in deps):
                    break
                start = max([free[s]] + [done[d] for d in deps])
                end = start + duration[op_kind]
                done[(op_kind, k, i)] = free[s] = end
                ops.append(Op(s, i, c, op_kind, start, end))
                position[s] += 1
                progressed = True
        if not progressed:  # cannot happen for this package's orders; guards hand-made ones
            raise RuntimeError(f"schedule {name!r} deadlocks: stages wait at {position}")
    return sorted(ops, key=lambda o: (o.start, o.stage))


def makespan(ops: Sequence[Op]) -> float:
    """From the first start to the last end."""
    return max(o.end for o in ops) - min(o.start for o in ops)


def bubble_fraction(ops: Sequence[Op]) -> float:
    """Idle time over ``n_stages * makespan``: ``1 - sum(busy) / (p * makespan)``."""
    if not ops:
        raise ValueError("ops is empty; pass the operations of schedule(...)")
    p = max(o.stage for o in ops) + 1
    return 1.0 - sum(o.end - o.start for o in ops) / (p * makespan(ops))


def ideal_bubble_fraction(kind: str, n_stages: int, n_microbatches: int, n_chunks: int = 1) -> float:
    """The closed form of the bubble, as a fraction of ``p * makespan``.

    GPipe and 1F1B: ``(p - 1) / (m + p - 1)`` (arXiv:1811.06965 gives
    ``O((p-1)/(m+p-1))``; arXiv:2104.04473 section 2.2.1 gives bubble time over ideal time, ``(p - 1) / m``).
    Interleaved with ``v`` chunks: the bubble time shrinks by ``v``
    (arXiv:2104.04473 section 2.2.2: ``(1/v)(p - 1) / m`` of the ideal time),
    so the fraction is ``(p - 1) / (v m + p - 1)``.
    """
    p, m, v, _ = _check(kind, n_stages, n_microbatches, n_chunks)
    return (p - 1) / (v * m + p - 1)


def peak_in_flight(ops: Sequence[Op]) -> list[int]:
    """Per stage, the most (chunk, micro-batch) units whose F has started and whose B has not ended.

    That is how many micro-batches' activations the stage stores at once
    (for interleaved, in units of one chunk: ``1 / v`` of the stage's layers).
    """
    events = defaultdict(list)
    for o in ops:
        events[o.stage].append((o.start, 1, 1) if o.kind == "F" else (o.end, 0, -1))
    return peak_per_stage(events, max(o.stage for o in ops) + 1)


def peak_per_stage(events: dict[int, list[tuple[float, int, float]]], n_stages: int) -> list:
    """Per stage, the highest running sum of ``(time, order, delta)`` events taken in time order.

    ``order`` breaks ties: at equal times a release (0) comes before a new store (1).
    """
    peaks = []
    for s in range(n_stages):
        held = peak = 0
        for _, _, delta in sorted(events[s]):
            held += delta
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def check_valid(ops: Sequence[Op], n_stages: int, n_microbatches: int, n_chunks: int = 1,
                eps: float = 1e-9, kinds: str = "FB") -> None:
    """Raise ``ValueError`` unless ``ops`` is a valid pipeline schedule.

    Valid: each (stage, chunk, microbatch) has exactly one operation of each of
    ``kinds`` ("FB", or "FBW" for a split backward); a stage never runs two
    operations at once; every operation starts after its inputs end (F of
    virtual stage ``k`` after F of ``k - 1``, B of ``k`` after B of ``k + 1``
    and F of ``k``, W after B).
    """
    p, m, v = n_stages, n_microbatches, n_chunks
    seen: dict[tuple[str, int, int], Op] = {}
    for o in ops:
        key = (o.kind, o.chunk * p + o.stage, o.microbatch)
        if key in seen:
            raise ValueError(f"{o.kind} of stage {o.stage}, chunk {o.chunk}, microbatch {o.microbatch} runs twice")
        if o.end < o.start - eps:
            raise ValueError(f"{o} ends before it starts")
        seen[key] = o
    for kind in kinds:
        for k in range(p * v):
            for i in range(m):
                if (kind, k, i) not in seen:
                    raise ValueError(f"{kind} of virtual stage {k}, microbatch {i} is missing")
    if len(seen) != len(kinds) * p * v * m:
        raise ValueError(f"expected {len(kinds) * p * v * m} operations, got {len(ops)}")
    for s in range(p):
        mine = sorted((o for o in ops if o.stage == s), key=lambda o: o.start)
        for a, b in zip(mine, mine[1:]):
            if b.start < a.end - eps:
                raise ValueError(f"stage {s} runs two operations at once: {a} and {b}")
    for (kind, k, i), o in seen.items():
        for d in _deps(kind, k, i, p * v):
            if o.start < seen[d].end - eps:
                raise ValueError(f"{o} starts before {seen[d]} (which it needs) ends")
