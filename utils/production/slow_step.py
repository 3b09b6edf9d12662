"""Part 6 lab 1's training step with planted problems, and the checks that find each one in its trace.

The step trains part 3's tiny LLaMA on a batch of sequences of different lengths (padded; the padding's
targets are ``IGNORE``), in five ``record_function`` ranges: ``forward``, ``loss``, ``backward``,
``clip`` (gradient clipping to a total norm of :data:`MAX_NORM`) and ``optimizer``. Each of
:data:`PROBLEMS` can be planted on its own (:func:`planted_step`, :func:`planted_optimizer`,
:func:`batch_for_step`):

- ``"host sync"``: the loss read back with ``.item()`` every step to log it, and the gradient norm read
  back to decide whether to clip: each ``.item()`` waits for the device (on a GPU the launch queue drains);
- ``"tiny kernels"``: the loss summed sequence by sequence in a Python loop, and the norm taken parameter by
  parameter: dozens of small operators where one or two would do;
- ``"unfused optimizer"``: AdamW's per-parameter loop (``foreach=False``, the CPU's default) instead of
  ``foreach`` or ``fused`` kernels;
- ``"recompilation"``: each batch trimmed to its longest sequence, so its shape changes every step, fed
  to a model compiled with ``dynamic=False``: Dynamo retraces at every new length.

Every variant computes the same loss and update (the clipping factor is ``clip_grad_norm_``'s,
``min(1, MAX_NORM / (norm + 1e-6))``): only the work differs. :func:`trace_counts` reads a profiler's
Chrome trace (``utils.production.trace_timeline.read_chrome_trace``) and counts, per profiled step, the
evidence of each problem: syncs (``aten::_local_scalar_dense``, what ``.item()`` dispatches), the
operators in the ``loss`` and ``clip`` ranges, those in the ``optimizer`` range, and Dynamo
compilations (its ``_compile.compile_inner (dynamo_timed)`` events); :func:`find_problems` turns the
counts into verdicts with the thresholds of :data:`LIMITS`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.production.profiled_step import quiet_kineto
from utils.production.trace_timeline import TraceEvent, read_chrome_trace
from utils.validate import check_nonnegative_int, check_positive_int

PROBLEMS = ("host sync", "tiny kernels", "unfused optimizer", "recompilation")
CONFIG = LlamaConfig(vocab=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2)
"""The model: part 3's tiny LLaMA, two layers of width 64 (as the profiling chapter's)."""
BATCH, MAX_LEN, MIN_LEN = 8, 48, 12
"""Sequences per batch, and the range of their lengths in tokens (the inputs are one shorter)."""
IGNORE = -100
"""The target of a padding position: ``F.cross_entropy``'s ``ignore_index``."""
MAX_NORM = 0.5
"""Gradient clipping's total norm."""
SYNC_OPS = ("aten::item", "aten::is_nonzero")
"""What Python's ``.item()`` and ``if tensor:`` dispatch: a read of a tensor's value by the host."""
COMPILE_EVENT = "_compile.compile_inner (dynamo_timed)"
RANGES = ("forward", "loss", "backward", "clip", "optimizer")
LIMITS = {"syncs": 0, "loss_and_clip_ops": 60, "optimizer_ops": 30, "compilations": 0}
"""A step is flagged when a count per step is above its limit. Operators are counted at the top level (those
Python called, not those they call in turn). The fixed step calls about 33 in ``loss`` and ``clip`` (22 of them
``clip_grad_norm_``'s own no-op ``.to(device)`` per parameter) and 2 in ``optimizer`` (fused AdamW); the
planted loops call about 130 and 216 (tests/production/test_slow_step.py)."""
HINTS = {
    "host sync": "the trace has aten::_local_scalar_dense in every step: a .item() (or a Python `if` on a tensor) "
                 "makes the host wait for the device. Keep the loss and the norm on the device: log once, at the "
                 "end, and clip with torch.nn.utils.clip_grad_norm_, which never reads the norm back.",
    "tiny kernels": "the loss and clip ranges dispatch hundreds of small operators: one cross-entropy over the "
                    "whole flattened batch (ignore_index for the padding) and clip_grad_norm_ (foreach) replace "
                    "the Python loops over sequences and parameters.",
    "unfused optimizer": "the optimizer range runs AdamW parameter by parameter: build it with fused=True (or "
                         "foreach=True) so each step is a few kernels over all parameters.",
    "recompilation": "Dynamo compiles during the profiled steps: the batch's shape changes every step and the "
                     "model was compiled with dynamic=False. Pad every batch to one length (trim=False), or let "
                     "Dynamo make the length symbolic.",
}
"""What each flagged problem looks like in the trace, and its usual fix."""


def _check_problems(problems: Iterable[str]) -> frozenset[str]:
    problems = frozenset(problems)
    unknown = problems - set(PROBLEMS)
    if unknown:
        raise ValueError(f"unknown problems {sorted(unknown)}; allowed: {PROBLEMS}")
    return problems


def batch_for_step(step: int, trim: bool = False, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` of step ``step``: :data:`BATCH` sequences of :data:`MIN_LEN` to :data:`MAX_LEN` tokens.

    The longest sequence of step ``s`` has ``MIN_LEN + 4 + (7 s mod 33)`` tokens (a different length for each of
    the first eight steps); the others are shorter. Padded to ``MAX_LEN - 1`` positions, or with ``trim`` to the
    batch's longest sequence (a shape that changes from step to step); a padding position has input 0 and target
    :data:`IGNORE`.
    """
    check_nonnegative_int("step", step)
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    longest = MIN_LEN + 4 + (7 * step) % (MAX_LEN - MIN_LEN - 3)
    lengths = torch.randint(MIN_LEN, longest + 1, (BATCH,), generator=g)
    lengths[int(torch.randint(0, BATCH, (1,), generator=g))] = longest
    tokens = torch.randint(0, CONFIG.vocab, (BATCH, MAX_LEN), generator=g)
    positions = torch.arange(MAX_LEN)
    tokens[positions >= lengths[:, None]] = 0
    inputs, targets = tokens[:, :-1].clone(), tokens[:, 1:].clone()
    targets[positions[1:] >= lengths[:, None]] = IGNORE
    if trim:
        width = int(lengths.max()) - 1
        inputs, targets = inputs[:, :width], targets[:, :width]
    return inputs, targets


def build(seed: int = 0, problems: Iterable[str] = PROBLEMS) -> tuple[nn.Module, Callable, torch.optim.Optimizer]:
    """The model, its compiled forward (Dynamo, ``backend="eager"``) and its AdamW, with ``problems`` planted."""
    problems = _check_problems(problems)
    torch.manual_seed(seed)
    model = TinyLlama(CONFIG)
    compiled = torch.compile(model, backend="eager", dynamic=False if "recompilation" in problems else None)
    return model, compiled, planted_optimizer(model.parameters(), "unfused optimizer" in problems)


def planted_optimizer(params: Iterable[nn.Parameter], unfused: bool) -> torch.optim.Optimizer:
    """AdamW (lr 1e-3): parameter by parameter if ``unfused``, else one fused kernel."""
    return torch.optim.AdamW(params, lr=1e-3, foreach=False) if unfused else torch.optim.AdamW(params, lr=1e-3,
                                                                                                   fused=True)


def planted_step(model: nn.Module, forward: Callable, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
                 targets: torch.Tensor, problems: Iterable[str] = PROBLEMS, log: list | None = None) -> torch.Tensor:
    """One training step with ``problems`` planted; returns the loss (a tensor). ``log`` collects ``.item()``s."""
    problems = _check_problems(problems)
    with record_function("forward"):
        logits = forward(inputs)
    with record_function("loss"):
        if "tiny kernels" in problems:
            total, count = logits.new_zeros(()), 0
            for i in range(inputs.shape[0]):  # one sequence at a time
                keep = targets[i] != IGNORE
                total = total + F.cross_entropy(logits[i][keep], targets[i][keep], reduction="sum")
                count = count + keep.sum()
            loss = total / count
        else:
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
        if "host sync" in problems:
            value = loss.item()
            if not math.isfinite(value):
                raise FloatingPointError(f"the loss is {value}")
            if log is not None:
                log.append(value)
    with record_function("backward"):
        loss.backward()
    with record_function("clip"):
        params = [p for p in model.parameters() if p.grad is not None]
        if "tiny kernels" in problems:
            norm = torch.stack([p.grad.norm() for p in params]).norm()
            factor = (MAX_NORM / (norm + 1e-6)).clamp(max=1.0)
            if "host sync" in problems and norm.item() <= MAX_NORM:
                factor = None
            if factor is not None:
                for p in params:
                    p.grad.mul_(factor)
        elif "host sync" in problems:
            norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm([p.grad for p in params])))
            if norm.item() > MAX_NORM:
                torch._foreach_mul_([p.grad for p in params], MAX_NORM / (norm + 1e-6))
        else:
            nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=True)
    with record_function("optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.detach()


@dataclass(frozen=True)
class StepCounts:
    """The evidence of :data:`PROBLEMS` per profiled step (means over the steps)."""

    steps: int
    syncs: float
    loss_and_clip_ops: float
    optimizer_ops: float
    compilations: float
    ops: float


def _inside(event: TraceEvent, spans: Sequence[TraceEvent]) -> bool:
    return any(s.lane == event.lane and s.start_us <= event.start_us and event.end_us <= s.end_us for s in spans)


def top_level_ops(events: Sequence[TraceEvent]) -> list[TraceEvent]:
    """The ``cpu_op`` events not nested in another ``cpu_op`` on their lane: the operators Python called.

    (A ``foreach`` or fused kernel on a CPU, or ``aten::linear``, dispatches further operators inside
    itself; those are not counted.)
    """
    out = []
    by_lane: dict[str, list[TraceEvent]] = {}
    for e in events:
        by_lane.setdefault(e.lane, []).append(e)
    for lane_events in by_lane.values():
        stack: list[TraceEvent] = []
        for e in sorted(lane_events, key=lambda e: (e.start_us, -e.duration_us)):
            while stack and e.start_us >= stack[-1].end_us:
                stack.pop()
            if e.category == "cpu_op" and not any(s.category == "cpu_op" for s in stack):
                out.append(e)
            stack.append(e)
    return out


def trace_counts(trace: str | Path | Sequence[TraceEvent]) -> StepCounts:
    """Count, in the ``ProfilerStep#`` ranges of a profiler's Chrome trace, what :func:`find_problems` judges.

    ``trace`` is the file (or its events, from :func:`~utils.production.trace_timeline.read_chrome_trace`).
    Operators and syncs are counted at the top level (:func:`top_level_ops`), leaving out Dynamo's own work
    while it compiles; syncs only in the ``forward``, ``loss``, ``backward`` and ``clip`` ranges, where the
    tensors live on the device (AdamW reads its step counters, CPU tensors, with ``item``; the data loader
    reads CPU data; neither waits for a GPU).
    """
    events = list(read_chrome_trace(trace)) if isinstance(trace, (str, Path)) else list(trace)
    steps = [e for e in events if e.name.startswith("ProfilerStep#")]
    if not steps:
        raise ValueError("no ProfilerStep# ranges in the trace: profile with a schedule and call prof.step()")
    in_steps = [e for e in events if _inside(e, steps)]
    compiling = [e for e in in_steps if e.name == COMPILE_EVENT]
    ops = [e for e in top_level_ops(in_steps) if not _inside(e, compiling)]
    ranges = {name: [e for e in in_steps if e.category == "user_annotation" and e.name == name] for name in RANGES}
    model_work = ranges["forward"] + ranges["loss"] + ranges["backward"] + ranges["clip"]
    n = len(steps)
    return StepCounts(
        steps=n,
        syncs=sum(e.name in SYNC_OPS and _inside(e, model_work) for e in ops) / n,
        loss_and_clip_ops=sum(_inside(e, ranges["loss"] + ranges["clip"]) for e in ops) / n,
        optimizer_ops=sum(_inside(e, ranges["optimizer"]) for e in ops) / n,
        compilations=sum(e.name == COMPILE_EVENT for e in in_steps) / n,
        ops=len(ops) / n)


def find_problems(counts: StepCounts) -> list[str]:
    """The problems whose evidence is above :data:`LIMITS`, in the order of :data:`PROBLEMS`."""
    found = {"host sync": counts.syncs > LIMITS["syncs"],
             "tiny kernels": counts.loss_and_clip_ops > LIMITS["loss_and_clip_ops"],
             "unfused optimizer": counts.optimizer_ops > LIMITS["optimizer_ops"],
             "recompilation": counts.compilations > LIMITS["compilations"]}
    return [p for p in PROBLEMS if found[p]]


def profile_steps(step: Callable[[int], object], trace_path: str | Path, warmup: int = 2,
                  active: int = 3) -> StepCounts:
    """Run ``step(i)`` for ``warmup + active`` steps under the profiler, write the active steps' trace, count it.

    The warm-up steps are traced and thrown away (the first compilation and the optimizer's state happen there).
    """
    check_nonnegative_int("warmup", warmup)
    check_positive_int("active", active)
    path = str(trace_path)
    with quiet_kineto(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
        return _profile(step, path, warmup, active)


def _profile(step: Callable[[int], object], path: str, warmup: int, active: int) -> StepCounts:
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=warmup, active=active),
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for i in range(warmup + active):
            step(i)
            prof.step()
    return trace_counts(path)
