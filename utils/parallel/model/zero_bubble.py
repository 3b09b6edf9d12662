"""Zero-bubble pipeline schedules: the backward split into B (input gradient) and W (weight gradient).

Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv:2401.10241.
A layer's backward computes two things: the gradient of its input (B), which
the previous stage waits for, and the gradient of its weights (W), which
nobody waits for until the optimizer step. 1F1B runs them together; splitting
them lets B hurry down the pipeline and W fill the idle slots. Dependencies
(:func:`utils.parallel.model.pipeline.simulate`): F after the previous stage's F; B
after its own F and the next stage's B; W after its own B.

Schedules (:func:`stage_orders`, stage ``r`` of ``p``, 0-indexed, ``m`` micro-batches):

- ``"1f1b"``: 1F1B with an unsplit backward, :func:`utils.parallel.model.pipeline.schedule`
  ``("1f1b", ...)`` with ``t_backward = t_b + t_w``, each backward then drawn as
  its B and its W (the previous stage waits for both);
- ``"zb-h1"`` (section 2.1): the warm-up of 1F1B (``p - 1 - r`` forwards), then
  ``r`` (F, B) pairs without W, then (F, B, W) triples in which W runs
  ``p - 1`` micro-batches behind F; the deferred Ws fill the cool-down. Every
  stage holds at most ``p`` micro-batches whose W has not run, as 1F1B;
- ``"zb-h2"`` (section 2.2): ``2(p - 1 - r)`` warm-up forwards, then
  (F, B, W) triples: stage 0 holds ``2p - 1`` micro-batches, and every stage is
  busy from its first F to its last W, a parallelogram.

Measured per stage, from a stage's own first operation to its own last
(:func:`stage_bubble`; stage 0's is the largest), the bubbles are the paper's Table 2:
``(p-1)(T_F+T_B+T_W)`` for 1F1B, ``(p-1)(T_F+T_B-T_W)`` for ZB-H1 and
``(p-1)(T_F+T_B-2T_W)`` for ZB-H2 (:func:`paper_bubble`), each for
``m >= p`` (ZB-H2: ``m >= 2p - 1``) and, for ZB-H1 and ZB-H2, a W no longer
than an F or a B. Per-stage bubble is what the step costs once stages start
the next iteration independently; that needs the paper's optimizer
post-validation (section 4), which removes the all-reduce before the step.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from utils.parallel.model.pipeline import Op, peak_per_stage, simulate
from utils.parallel.model.pipeline import schedule as pp_schedule
from utils.validate import check_nonnegative_int, check_positive, check_positive_int

KINDS = ("1f1b", "zb-h1", "zb-h2")


def _check(kind: str, n_stages: int, n_microbatches: int) -> tuple[int, int]:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    return check_positive_int("n_stages", n_stages), check_positive_int("n_microbatches", n_microbatches)


def stage_orders(kind: str, n_stages: int, n_microbatches: int) -> list[list[tuple[str, int, int]]]:
    """For each stage, its operations in order, as ``(kind, chunk, microbatch)`` with kind "F", "B" or "W"."""
    p, m = _check(kind, n_stages, n_microbatches)
    orders = []
    for r in range(p):
        warmup = min(2 * (p - 1 - r) if kind == "zb-h2" else p - 1 - r, m)
        lag = {"1f1b": 0, "zb-h1": r, "zb-h2": 2 * r}[kind]  # how many micro-batches W trails B by
        order = [("F", 0, i) for i in range(warmup)]
        next_b = next_w = 0
        for i in range(warmup, m):
            order += [("F", 0, i), ("B", 0, next_b)]
            next_b += 1
            if next_b - next_w > lag:
                order.append(("W", 0, next_w))
                next_w += 1
        for i in range(next_b, m):  # cool-down: each remaining B, then the oldest deferred W
            order += [("B", 0, i), ("W", 0, next_w)]
            next_w += 1
        order += [("W", 0, i) for i in range(next_w, m)]
        orders.append(order)
    return orders


def schedule(kind: str, n_stages: int, n_microbatches: int, t_forward: float = 1.0,
             t_input_grad: float = 1.0, t_weight_grad: float = 1.0) -> list[Op]:
    """Simulate ``kind`` with F, B and W taking ``t_forward``, ``t_input_grad``, ``t_weight_grad`` per stage.

    The paper's analysis takes the three equal (its section 2); a real layer's
    B and W each cost about one F (two GEMMs of the same size as F's one).
    Returns :class:`utils.parallel.model.pipeline.Op` with kind "F", "B" or "W".
    """
    p, m = _check(kind, n_stages, n_microbatches)
    duration = {"F": check_positive("t_forward", t_forward, finite=True),
                "B": check_positive("t_input_grad", t_input_grad, finite=True),
                "W": check_positive("t_weight_grad", t_weight_grad, finite=True)}
    if kind == "1f1b":  # one backward of t_b + t_w: the previous stage waits for W too; then cut it in two
        fused = pp_schedule("1f1b", p, m, 1, duration["F"], duration["B"] + duration["W"])
        ops = []
        for o in fused:
            if o.kind == "F":
                ops.append(o)
            else:
                ops += [o._replace(end=o.start + duration["B"]), o._replace(kind="W", start=o.start + duration["B"])]
        return sorted(ops, key=lambda o: (o.start, o.stage))
    return simulate(stage_orders(kind, p, m), duration, name=kind)


def stage_bubble(ops: Sequence[Op]) -> list[float]:
    """Per stage, its idle time between its own first start and its own last end (the paper's Table 2 measure)."""
    if not ops:
        raise ValueError("ops is empty; pass the operations of schedule(...)")
    per_stage: dict[int, list[Op]] = defaultdict(list)
    for o in ops:
        per_stage[o.stage].append(o)
    return [max(o.end for o in mine) - min(o.start for o in mine) - sum(o.end - o.start for o in mine)
            for _, mine in sorted(per_stage.items())]


def paper_bubble(kind: str, n_stages: int, t_forward: float = 1.0, t_input_grad: float = 1.0,
                 t_weight_grad: float = 1.0) -> float:
    """Table 2 of arXiv:2401.10241: the bubble of the largest stage, in the unit of the times.

    1F1B ``(p-1)(T_F+T_B+T_W)``; ZB-H1 ``(p-1)(T_F+T_B-T_W)``; ZB-H2 ``(p-1)(T_F+T_B-2T_W)``.
    """
    p = check_positive_int("n_stages", n_stages)
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    f = check_positive("t_forward", t_forward, finite=True)
    b = check_positive("t_input_grad", t_input_grad, finite=True)
    w = check_positive("t_weight_grad", t_weight_grad, finite=True)
    return (p - 1) * {"1f1b": f + b + w, "zb-h1": f + b - w, "zb-h2": f + b - 2 * w}[kind]


def peak_activations(ops: Sequence[Op], weight_grad_share: float = 1.0) -> list[float]:
    """Per stage, the peak stored activations in units of one micro-batch's full set (the paper's M_B).

    A micro-batch holds ``1`` from the start of its F to the end of its B, and
    ``weight_grad_share`` (the paper's M_W / M_B: W needs only the layers'
    inputs and the output gradients, Table 1) from then to the end of its W.
    With the default 1.0 this counts micro-batches whose W has not ended.
    """
    share = check_positive("weight_grad_share", weight_grad_share)
    if share > 1:
        raise ValueError(f"weight_grad_share must be in (0, 1] (W keeps a part of what B needs), got {share}")
    if not ops:
        raise ValueError("ops is empty; pass the operations of schedule(...)")
    p = max(o.stage for o in ops) + 1
    events: dict[int, list[tuple[float, int, float]]] = defaultdict(list)
    for o in ops:
        if o.kind == "F":
            events[o.stage].append((o.start, 1, 1.0))
        elif o.kind == "B":
            events[o.stage].append((o.end, 0, share - 1.0))
        else:
            events[o.stage].append((o.end, 0, -share))
    return [float(peak) for peak in peak_per_stage(events, p)]


def paper_stage_memory(kind: str, n_stages: int, stage: int, weight_grad_share: float) -> float:
    """Section 2.1/2.2's peak activations of stage ``stage`` (0-indexed), in units of M_B.

    1F1B: ``p - r`` micro-batches. ZB-H1: worker ``i = r + 1`` holds
    ``(p - i + 1) M_B + (i - 1) M_W``, at most ``p M_B``. ZB-H2: stage 0 holds
    ``2p - 1`` full micro-batches, the peak; stage ``r`` holds ``2(p - r) - 1``
    full ones and ``2r`` awaiting their W (the same count as ZB-H1's, doubled).
    """
    p = check_positive_int("n_stages", n_stages)
    r = check_nonnegative_int("stage", stage)
    if r >= p:
        raise ValueError(f"stage must be below n_stages ({p}), got {r}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    return {"1f1b": p - r, "zb-h1": (p - r) + r * weight_grad_share, "zb-h2": 2 * (p - r) - 1 + 2 * r * weight_grad_share}[kind]
