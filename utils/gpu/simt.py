"""SIMT execution: how a warp runs an ``if``/``else``, and how many warps it takes to hide memory latency.

Two small models, each a few lines of arithmetic.

**Divergence.**
A warp issues one instruction at a time for all its lanes. When the lanes
disagree on a branch, the warp runs *both* paths one after the other, each
with the lanes that did not take it switched off, and reconverges after the
``else`` (CUDA C++ Programming Guide, "SIMT Architecture": "If threads of a
warp diverge via a data-dependent conditional branch, the warp executes each
branch path taken, disabling threads that are not on that path"; the term
SIMT is from Lindholm et al., "NVIDIA Tesla: A Unified Graphics and Computing
Architecture", IEEE Micro 2008). Independent thread scheduling (Volta and
later) lets the diverged paths interleave, but they are still issued
separately, so the cost counted here is unchanged.

The measure is *SIMT efficiency*: the fraction of issued lane-slots that do
useful work, ``useful lane-instructions / (warp_size * issued instructions)``.

**Latency hiding.** By Little's law, sustaining a bandwidth takes
``bandwidth * latency`` bytes in flight (:func:`utils.gpu.hardware.bytes_in_flight`).
:func:`warps_needed_per_sm` turns that into warps waiting on loads per SM;
:data:`POINTER_CHASE_DRAM_LATENCY` holds measured DRAM latencies to feed it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, NamedTuple

import numpy as np

from utils.gpu.hardware import WARP_SIZE, bytes_in_flight
from utils.validate import check_nonnegative_int, check_positive, check_positive_int


@dataclass(frozen=True)
class IssueSlot:
    """One instruction issued by a warp: what it is and which lanes it does useful work for."""

    label: str
    active: np.ndarray  # bool, one entry per lane

    @property
    def active_fraction(self) -> float:
        """Active lanes / lanes in the warp."""
        return float(self.active.mean())


def _check_costs(then_instructions: int, else_instructions: int) -> None:
    for value, what in ((then_instructions, "then_instructions"), (else_instructions, "else_instructions")):
        check_nonnegative_int(f"{what} (instructions on that path)", value)
    if then_instructions + else_instructions == 0:
        raise ValueError("then_instructions and else_instructions are both 0: a branch with no work on "
                         "either path has no efficiency; give at least one path an instruction")


def _as_predicate(taken, warp_size: int) -> np.ndarray:
    check_positive_int("warp_size", warp_size)
    taken = np.asarray(taken)
    if taken.dtype != bool or taken.ndim != 1:
        raise ValueError(f"taken must be a 1-D array of bools (one per thread: does it take the `if` path?), "
                         f"got dtype {taken.dtype} with shape {taken.shape}")
    if taken.size == 0 or taken.size % warp_size:
        raise ValueError(f"taken has {taken.size} threads; it must be a positive multiple of the warp size "
                         f"{warp_size} (pad the last warp with the value its idle lanes would take)")
    return taken


def branch_trace(taken, then_instructions: int, else_instructions: int,
                 before: int = 0, after: int = 0) -> list[IssueSlot]:
    """The instructions one warp issues for ``before; if (taken) {then} else {else}; after``.

    ``taken`` holds one bool per lane. Each path is issued only if at least
    one lane takes it, with exactly those lanes active; ``before`` and
    ``after`` instructions run with every lane active (the warp reconverges).
    """
    taken = _as_predicate(taken, max(np.asarray(taken).size, 1))
    _check_costs(then_instructions, else_instructions)
    for value, what in ((before, "before"), (after, "after")):
        check_nonnegative_int(what, value)
    everyone = np.ones_like(taken)
    slots = [IssueSlot(f"before {i + 1}/{before}", everyone) for i in range(before)]
    if taken.any():
        slots += [IssueSlot(f"then {i + 1}/{then_instructions}", taken.copy()) for i in range(then_instructions)]
    if not taken.all():
        slots += [IssueSlot(f"else {i + 1}/{else_instructions}", ~taken) for i in range(else_instructions)]
    slots += [IssueSlot(f"after {i + 1}/{after}", everyone) for i in range(after)]
    return slots


def trace_efficiency(slots: list[IssueSlot]) -> float:
    """SIMT efficiency of a trace: the mean active fraction over its issued instructions."""
    if not slots:
        raise ValueError("the trace is empty: a warp that issues nothing has no efficiency")
    return float(np.mean([s.active_fraction for s in slots]))


def branch_efficiency(taken, then_instructions: int, else_instructions: int, warp_size: int = WARP_SIZE) -> float:
    """SIMT efficiency of an ``if``/``else`` over a whole launch, thread ``i`` taking the ``if`` iff ``taken[i]``.

    Threads ``[w * warp_size, (w + 1) * warp_size)`` form warp ``w``. With
    ``t_w`` taken lanes in warp ``w``, ``a`` = ``then_instructions`` and
    ``b`` = ``else_instructions``::

        issued_w = a * [t_w > 0] + b * [t_w < warp_size]
        useful_w = a * t_w + b * (warp_size - t_w)
        efficiency = sum_w useful_w / (warp_size * sum_w issued_w)

    It is 1 when no warp diverges, 1/2 when every warp splits evenly and
    ``a == b``, and never below ``1 / warp_size``.
    """
    taken = _as_predicate(taken, warp_size)
    _check_costs(then_instructions, else_instructions)
    per_warp = taken.reshape(-1, warp_size).sum(axis=1)
    a, b = then_instructions, else_instructions
    issued = a * (per_warp > 0) + b * (per_warp < warp_size)
    useful = a * per_warp + b * (warp_size - per_warp)
    return float(useful.sum() / (warp_size * issued.sum()))


def divergent_warps(taken, warp_size: int = WARP_SIZE) -> int:
    """How many warps have lanes on both sides of the branch (and so run both paths)."""
    taken = _as_predicate(taken, warp_size)
    per_warp = taken.reshape(-1, warp_size).sum(axis=1)
    return int(((per_warp > 0) & (per_warp < warp_size)).sum())


class MeasuredLatency(NamedTuple):
    """A latency measured in core clock cycles at a known clock; ``seconds`` converts it."""

    cycles: float
    clock_hz: float
    source: str

    @property
    def seconds(self) -> float:
        """``cycles / clock_hz``."""
        return self.cycles / self.clock_hz


_GPU_BENCHES = ("gpu-benches (github.com/te42kyfo/gpu-benches, also RRZE-HPC/gpu-benches): a single small thread "
                "block (64 threads in gpu-latency, one warp in the README's cuda-latency) follows one chain of "
                "pointers through a random cycle over a buffer far larger than L2")
POINTER_CHASE_DRAM_LATENCY: Mapping[str, MeasuredLatency] = MappingProxyType({
    "V100-PCIe": MeasuredLatency(436.0, 1380e6, _GPU_BENCHES + "; README, cuda-latency, 524288 kB buffer"),
    "H100-PCIe": MeasuredLatency(658.4, 1755e6, _GPU_BENCHES + "; gpu-latency/h100_pcie.txt, 1529075 kB buffer"),
})
"""Unloaded DRAM load-to-use latency (an idle memory system: latency under load is higher, from queueing)."""


def warps_needed_per_sm(bandwidth_bytes_per_s: float, latency_seconds: float, sm_count: int,
                        bytes_per_thread_per_load: int, loads_in_flight_per_thread: int = 1,
                        warp_size: int = WARP_SIZE) -> float:
    """Warps per SM that must be waiting on loads to sustain ``bandwidth_bytes_per_s`` (Little's law).

    ``bandwidth * latency`` bytes must be in flight (Little, "A proof for the
    queuing formula L = lambda W", Operations Research 1961), spread over
    ``sm_count`` SMs; one warp has ``warp_size * bytes_per_thread_per_load *
    loads_in_flight_per_thread`` bytes outstanding::

        warps = bandwidth * latency / (sm_count * warp_size * bytes_per_thread_per_load * loads_in_flight_per_thread)

    (Volkov, "Understanding Latency Hiding on GPUs", PhD thesis, UC Berkeley
    2016, makes this argument for GPUs.) A fractional result means the last
    warp needs only part of its loads; round up for a warp count.
    """
    for value, what in ((sm_count, "sm_count"), (bytes_per_thread_per_load, "bytes_per_thread_per_load"),
                        (loads_in_flight_per_thread, "loads_in_flight_per_thread"), (warp_size, "warp_size")):
        check_positive_int(what, value)
    check_positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    check_positive("latency_seconds", latency_seconds)
    bytes_per_warp = warp_size * bytes_per_thread_per_load * loads_in_flight_per_thread
    return bytes_in_flight(bandwidth_bytes_per_s, latency_seconds) / sm_count / bytes_per_warp
