"""How much of DDP's gradient all-reduce hides behind the backward pass: a timeline model.

PyTorch's ``DistributedDataParallel`` (DDP) does not wait for the whole
backward pass before it averages gradients. It groups the gradients into
*buckets* in the order backward produces them (last layer first), and launches
an asynchronous all-reduce for a bucket as soon as all of its gradients are
ready, so communication of late layers overlaps the backward computation of
early ones (Li et al., "PyTorch Distributed: Experiences on Accelerating Data
Parallel Training", VLDB 2020, arXiv:2006.15704, section 3.2).

This module is the smallest model of that schedule that keeps its shape:

- backward computes units (layers or parameters) from last to first, taking
  ``backward_seconds[i]`` each, with no slowdown from communication (on a GPU
  the all-reduce runs on the network and its own kernels; see the caveat in
  :func:`ddp_timeline`);
- buckets are formed as DDP's reducer forms them
  (:func:`utils.parallel.data.data_parallel.plan_buckets`, tested against PyTorch);
- all-reduces run one at a time, in bucket order, each priced by
  :func:`utils.parallel.comm.network.ring_allreduce_time`;
- a bucket's all-reduce starts when its last gradient is ready and the previous
  all-reduce has finished.

DDP's default caps (25 MiB, the first bucket 1 MiB) are
:data:`utils.parallel.data.data_parallel.DDP_DEFAULTS`.

:func:`min_tokens_to_hide_communication` is the same question asked without a
timeline: how many tokens per GPU make the compute of a step at least as long
as its data-parallel communication (the "when do we become communication
bound" argument of Austin et al., *How to Scale Your Model*, part 5, 2025).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Sequence

from utils.parallel.data.data_parallel import plan_buckets
from utils.parallel.comm.network import ring_allreduce_time
from utils.validate import check_nonnegative, check_positive, check_positive_int

def _check_sizes(grad_nbytes: Sequence[float]) -> None:
    if len(grad_nbytes) == 0:
        raise ValueError("grad_nbytes is empty; give one gradient size (bytes) per unit, in forward order")
    for i, n in enumerate(grad_nbytes):
        check_nonnegative(f"grad_nbytes[{i}] (bytes)", n, finite=True)


@dataclass(frozen=True)
class BucketTimes:
    """One bucket of :func:`ddp_timeline`: which units, how many bytes, and when (seconds from backward's start)."""

    units: tuple[int, ...]
    nbytes: float
    ready_seconds: float
    start_seconds: float
    end_seconds: float


@dataclass(frozen=True)
class DDPTimeline:
    """The result of :func:`ddp_timeline`; all times in seconds from the start of backward."""

    grad_ready_seconds: tuple[float, ...]
    """When each unit's gradient is ready, indexed in forward order."""
    buckets: tuple[BucketTimes, ...]
    """The all-reduce buckets in launch order."""
    compute_seconds: float
    """Total backward compute: ``sum(backward_seconds)``."""
    comm_seconds: float
    """Total all-reduce time if nothing overlapped: the sum over buckets."""
    step_seconds: float
    """From the start of backward until the last all-reduce has finished."""

    @property
    def exposed_comm_seconds(self) -> float:
        """Communication time not hidden behind compute: ``step_seconds - compute_seconds``."""
        return self.step_seconds - self.compute_seconds


def ddp_timeline(
    backward_seconds: Sequence[float],
    grad_nbytes: Sequence[float],
    bucket_cap_nbytes: float,
    n_gpus: int,
    bandwidth_bytes_per_s: float,
    latency_seconds: float,
    first_bucket_cap_nbytes: float | None = None,
    allreduce_seconds: Callable[[float], float] | None = None,
) -> DDPTimeline:
    """Backward plus bucketed gradient all-reduce, overlapped the way DDP schedules it.

    Units are given in forward order: ``backward_seconds[i]`` and
    ``grad_nbytes[i]`` belong to unit ``i``; backward runs ``L-1, ..., 0``. With
    buckets ``b = 1, 2, ...`` from :func:`utils.parallel.data.data_parallel.plan_buckets`
    (the caps mean what they mean there):

    - ``ready_b`` = time the last gradient of bucket ``b`` is ready;
    - ``start_b = max(ready_b, end_{b-1})`` (one all-reduce at a time, in order);
    - ``end_b = start_b + ring_allreduce_time(n_gpus, nbytes_b, bandwidth, latency)``, or
      ``start_b + allreduce_seconds(nbytes_b)`` when a cost model is given (e.g. several
      rings over two levels, :func:`utils.parallel.comm.network.flat_ring_allreduce_time`;
      ``n_gpus``, ``bandwidth`` and ``latency`` are then only validated);
    - ``step = max(sum(backward_seconds), end_last)``.

    Hence ``max(compute, comm) <= step <= compute + comm``: one bucket gives
    the upper bound (nothing overlaps), and free communication gives
    ``compute``. The model assumes that communication does not slow compute
    down. That holds roughly on GPUs with a separate network, and it fails where
    the same CPU cores both compute and move the bytes (gloo on a laptop).
    """
    if len(backward_seconds) != len(grad_nbytes):
        raise ValueError(f"backward_seconds has {len(backward_seconds)} entries but grad_nbytes has "
                         f"{len(grad_nbytes)}; give one of each per unit, in forward order")
    _check_sizes(grad_nbytes)
    for i, s in enumerate(backward_seconds):
        check_nonnegative(f"backward_seconds[{i}] (seconds of compute)", s, finite=True)
    # Validate the link once, even for a model whose buckets are all empty.
    ring_allreduce_time(n_gpus, 0.0, bandwidth_bytes_per_s, latency_seconds)
    buckets = plan_buckets(grad_nbytes, bucket_cap_nbytes, first_bucket_cap_nbytes)

    ready = [0.0] * len(backward_seconds)
    clock = 0.0
    for i in reversed(range(len(backward_seconds))):
        clock += backward_seconds[i]
        ready[i] = clock
    compute = clock

    times: list[BucketTimes] = []
    link_free = 0.0
    comm = 0.0
    for units in buckets:
        nbytes = float(sum(grad_nbytes[i] for i in units))
        ready_b = max(ready[i] for i in units)
        if allreduce_seconds is None:
            duration = ring_allreduce_time(n_gpus, nbytes, bandwidth_bytes_per_s, latency_seconds)
        else:
            duration = float(allreduce_seconds(nbytes))
            check_nonnegative(f"allreduce_seconds({nbytes:g}) (seconds)", duration, finite=True)
        start = max(ready_b, link_free)
        link_free = start + duration
        comm += duration
        times.append(BucketTimes(tuple(units), nbytes, ready_b, start, link_free))
    return DDPTimeline(tuple(ready), tuple(times), compute, comm, max(compute, link_free))


_TRAFFIC = MappingProxyType({
    # strategy: (elements each GPU sends per parameter, large-N limit; FLOPs per parameter per token it hides behind)
    "dp": (2, 4),    # all-reduce of the gradients (2 Psi), only during backward (4 P T FLOPs)
    "fsdp": (3, 6),  # all-gather in forward and backward + reduce-scatter (3 Psi), over forward + backward (6 P T)
})


def min_tokens_to_hide_communication(flops_per_s: float, bandwidth_bytes_per_s: float, strategy: str = "dp",
                                     n_gpus: int | None = None, bytes_per_element: float = 2) -> float:
    """Tokens per GPU per step above which data-parallel communication can hide behind compute.

    With ``P`` parameters and ``T`` tokens per GPU, the compute that can cover
    the communication is ``F P T / C`` seconds and the communication
    ``v b P / W`` seconds, so it hides when

    ``T >= v b C / (F W)``,  independent of ``P``:

    - ``"dp"`` (DDP, ZeRO-1/2): a ring all-reduce of the gradients sends
      ``v = 2(N-1)/N`` elements per parameter, and it can only overlap the
      backward pass, ``F = 4`` FLOPs per parameter per token;
    - ``"fsdp"`` (ZeRO-3): all-gather in forward, again in backward, then
      reduce-scatter, ``v = 3(N-1)/N``, spread over forward and backward, ``F = 6``.

    ``C`` is the FLOP/s a GPU sustains, ``W`` the per-GPU (bus) bandwidth of the
    collective in bytes/s, ``b`` the bytes per element (2 for bf16). With
    ``n_gpus=None`` the large-``N`` limit ``(N-1)/N -> 1`` is used, and with
    ``b = 2`` both strategies give ``T >= C / W``: the per-device batch ``B/X > C/W``
    of Austin et al., *How to Scale Your Model* (2025), part 5 ("Training"),
    who find 2,550 tokens for a TPU v5p (``C = 4.6e14``, ``W = 2 * 9e10``).
    Attention's own FLOPs, latency and imperfect overlap are ignored: a lower bound.
    """
    check_positive("flops_per_s", flops_per_s)
    check_positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    check_positive("bytes_per_element", bytes_per_element)
    if strategy not in _TRAFFIC:
        raise ValueError(f"strategy must be one of {sorted(_TRAFFIC)}, got {strategy!r}")
    elements, flops = _TRAFFIC[strategy]
    if n_gpus is not None:
        check_positive_int("n_gpus", n_gpus)
        elements = elements * (n_gpus - 1) / n_gpus
    return elements * bytes_per_element * flops_per_s / (flops * bandwidth_bytes_per_s)
