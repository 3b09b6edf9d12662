"""One FSDP (ZeRO-3) training step on one rank, as events on a compute and a communication stream.

The model is ``L`` equal units (transformer blocks) of ``unit_params`` parameters each.
Forward, unit by unit: all-gather the unit's parameters, compute, free them
(``reshard_after_forward=True``). Backward, in reverse: all-gather again, compute the
gradients, free the parameters, reduce-scatter the gradients and free them when the
reduce-scatter ends (Zhao et al., "PyTorch FSDP", VLDB 2023, arXiv:2304.11277, section 3;
ZeRO's stage 3, Rajbhandari et al. 2020, arXiv:1910.02054, section 5.3).

Two streams, as on a GPU: compute runs the units in order; communication runs the
collectives one at a time, first issued first served (they share one network). An
operation starts when it is issued, its inputs are ready and its stream is free.

- Without prefetch, the all-gather of unit ``i`` is issued when unit ``i`` is about to
  run, so every collective sits on the critical path: the step takes
  ``L (t_f + t_b + 2 t_ag + t_rs)``.
- With prefetch (FSDP1's ``forward_prefetch`` and ``BackwardPrefetch.BACKWARD_PRE``,
  FSDP2's implicit and explicit prefetching), the next unit's all-gather is issued
  when the current unit starts computing. Each unit then costs ``max(compute, comm)``
  instead of the sum; only the first all-gather of each pass and the last
  reduce-scatter stay exposed. When compute is longer (``t_ag <= t_f`` and
  ``t_ag + t_rs <= t_b``) the step is ``L (t_f + t_b) + 2 t_ag + t_rs``.

Memory on the rank: the sharded states ``(2 + 2 + K) L unit_params / N`` all the time;
a gathered unit (``param_bytes`` per parameter) from the issue of its all-gather to the
end of its compute; a unit's unsharded gradients (``grad_bytes``) from the start of its
backward to the end of its reduce-scatter; a unit's activations from the start of its
forward to the end of its backward. With prefetch and ``L >= 3`` the peak is

``S + 2 p U + g U + (L - 1) A + max(A, g U)``

(``S`` sharded states, ``U`` unit parameters, ``p``/``g`` bytes per gathered parameter /
gradient, ``A`` activations per unit): two gathered units, two units of gradients while
the previous unit's reduce-scatter finishes, and the activations, which peak at the
start of backward when only one unit of gradients exists. Without prefetch: one unit of
each, ``S + p U + g U + L A``.
"""

from __future__ import annotations

from dataclasses import dataclass

from utils.validate import check_nonnegative, check_positive, check_positive_int

MEMORY_KINDS = ("sharded states", "gathered parameters", "unsharded gradients", "activations")


@dataclass(frozen=True)
class Event:
    """One operation: ``stream`` is "compute" or "comm"; ``kind`` one of "forward", "backward",
    "all-gather", "reduce-scatter"; ``phase`` "forward" or "backward"; times in seconds."""

    stream: str
    kind: str
    unit: int
    phase: str
    start: float
    end: float


@dataclass(frozen=True)
class Allocation:
    """``nbytes`` of ``kind`` (one of :data:`MEMORY_KINDS`) held for ``unit`` over [start, end)."""

    kind: str
    unit: int
    nbytes: float
    start: float
    end: float


@dataclass(frozen=True)
class FsdpStep:
    """The timeline of one step: its events, its allocations and the constant sharded bytes."""

    events: tuple[Event, ...]
    allocations: tuple[Allocation, ...]
    sharded_bytes: float

    @property
    def step_seconds(self) -> float:
        return max(e.end for e in self.events)

    def memory_at(self, t: float) -> dict[str, float]:
        """Bytes held at time ``t``, by kind (the allocations live over [start, end))."""
        held = dict.fromkeys(MEMORY_KINDS, 0.0)
        held["sharded states"] = self.sharded_bytes
        for a in self.allocations:
            if a.start <= t < a.end:
                held[a.kind] += a.nbytes
        return held

    def memory_curve(self) -> tuple[list[float], list[float]]:
        """Times at which memory changes, and the total bytes held from each of them on (a step function)."""
        times = sorted({0.0, self.step_seconds} | {a.start for a in self.allocations} | {a.end for a in self.allocations})
        return times, [sum(self.memory_at(t).values()) for t in times]

    @property
    def peak_bytes(self) -> float:
        return max(self.memory_curve()[1])

    def exposed_comm_seconds(self) -> float:
        """Step time not covered by compute: the communication the compute stream waited for."""
        return self.step_seconds - sum(e.end - e.start for e in self.events if e.stream == "compute")


class _Streams:
    """Compute and comm streams, each running its operations in issue order."""

    def __init__(self) -> None:
        self.free = {"compute": 0.0, "comm": 0.0}
        self.events: list[Event] = []

    def run(self, stream: str, kind: str, unit: int, phase: str, seconds: float, ready: float = 0.0) -> Event:
        start = max(self.free[stream], ready)
        event = Event(stream, kind, unit, phase, start, start + seconds)
        self.free[stream] = event.end
        self.events.append(event)
        return event


def simulate_fsdp_step(n_units: int, unit_params: float, n_gpus: int, forward_seconds: float,
                       all_gather_seconds: float, backward_seconds: float | None = None,
                       reduce_scatter_seconds: float | None = None, prefetch: bool = True,
                       activation_bytes_per_unit: float = 0.0, param_bytes: float = 2,
                       grad_bytes: float = 2, optimizer_bytes_per_param: float = 12) -> FsdpStep:
    """Simulate one FSDP step of ``n_units`` equal units on one of ``n_gpus`` ranks.

    Times are per unit: ``forward_seconds`` (``t_f``), ``backward_seconds`` (``t_b``,
    default ``2 t_f``), ``all_gather_seconds`` (``t_ag``), ``reduce_scatter_seconds``
    (``t_rs``, default ``t_ag``). Bytes per parameter: ``param_bytes`` gathered (bf16: 2),
    ``grad_bytes`` of unsharded gradients (2 for a bf16 reduce, 4 for fp32), and the sharded
    states ``2 + 2 + optimizer_bytes_per_param`` (ZeRO's 16 with K = 12). See the module
    docstring for the schedule and the peak-memory formula it obeys.
    """
    n_units = check_positive_int("n_units", n_units)
    unit_params = check_positive("unit_params", unit_params, finite=True)
    n_gpus = check_positive_int("n_gpus", n_gpus)
    t_f = check_positive("forward_seconds", forward_seconds, finite=True)
    t_b = 2 * t_f if backward_seconds is None else check_positive("backward_seconds", backward_seconds, finite=True)
    t_ag = check_nonnegative("all_gather_seconds", all_gather_seconds, finite=True)
    t_rs = t_ag if reduce_scatter_seconds is None else check_nonnegative(
        "reduce_scatter_seconds", reduce_scatter_seconds, finite=True)
    if not isinstance(prefetch, bool):
        raise ValueError(f"prefetch must be True or False, got {prefetch!r}")
    act = check_nonnegative("activation_bytes_per_unit", activation_bytes_per_unit, finite=True)
    p = check_positive("param_bytes", param_bytes, finite=True)
    g = check_positive("grad_bytes", grad_bytes, finite=True)
    k = check_nonnegative("optimizer_bytes_per_param", optimizer_bytes_per_param, finite=True)

    s = _Streams()
    gathered: dict[tuple[str, int], tuple[float, Event]] = {}  # (phase, unit) -> (issue time, all-gather)
    allocations: list[Allocation] = []

    def gather(phase: str, unit: int, issued: float) -> None:
        gathered[phase, unit] = (issued, s.run("comm", "all-gather", unit, phase, t_ag, ready=issued))

    def compute(phase: str, unit: int, seconds: float) -> Event:
        issued, ag = gathered.pop((phase, unit))
        event = s.run("compute", phase, unit, phase, seconds, ready=ag.end)
        allocations.append(Allocation("gathered parameters", unit, p * unit_params, issued, event.end))
        return event

    forward_start: dict[int, float] = {}
    gather("forward", 0, 0.0)
    for i in range(n_units):
        start_i = max(s.free["compute"], gathered["forward", i][1].end)
        if prefetch and i + 1 < n_units:
            gather("forward", i + 1, start_i)  # issued as unit i starts computing
        event = compute("forward", i, t_f)
        forward_start[i] = event.start
        if not prefetch and i + 1 < n_units:
            gather("forward", i + 1, event.end)  # issued when unit i + 1 is about to run

    last = n_units - 1
    gather("backward", last, s.free["compute"])
    for j in range(last, -1, -1):
        start_j = max(s.free["compute"], gathered["backward", j][1].end)
        if prefetch and j >= 1:
            gather("backward", j - 1, start_j)
        event = compute("backward", j, t_b)
        allocations.append(Allocation("activations", j, act, forward_start[j], event.end))
        rs = s.run("comm", "reduce-scatter", j, "backward", t_rs, ready=event.end)
        allocations.append(Allocation("unsharded gradients", j, g * unit_params, event.start, rs.end))
        if not prefetch and j >= 1:
            gather("backward", j - 1, event.end)

    sharded = (2 + 2 + k) * n_units * unit_params / n_gpus  # ZeRO-3: (2 + 2 + K) Psi / N
    return FsdpStep(tuple(sorted(s.events, key=lambda e: (e.start, e.stream))), tuple(allocations), sharded)


def peak_bytes_formula(n_units: int, unit_params: float, n_gpus: int, prefetch: bool = True,
                       activation_bytes_per_unit: float = 0.0, param_bytes: float = 2, grad_bytes: float = 2,
                       optimizer_bytes_per_param: float = 12) -> float:
    """The peak of :func:`simulate_fsdp_step` by hand (module docstring), when compute hides the
    communication: with prefetch and ``L >= 3``, ``S + 2pU + gU + (L-1)A + max(A, gU)``; without, ``S + pU + gU + LA``."""
    n_units = check_positive_int("n_units", n_units)
    if prefetch and n_units < 3:
        raise ValueError(f"the prefetch formula needs n_units >= 3, got {n_units}")
    u, a = unit_params, activation_bytes_per_unit
    sharded = (2 + 2 + optimizer_bytes_per_param) * n_units * u / check_positive_int("n_gpus", n_gpus)
    if prefetch:
        return sharded + 2 * param_bytes * u + grad_bytes * u + (n_units - 1) * a + max(a, grad_bytes * u)
    return sharded + param_bytes * u + grad_bytes * u + n_units * a
