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
- buckets are formed as DDP's reducer forms them (:func:`assign_buckets`);
- all-reduces run one at a time, in bucket order, each priced by
  :func:`utils.parallel.network.ring_allreduce_time`;
- a bucket's all-reduce starts when its last gradient is ready and the previous
  all-reduce has finished.

The numbers in :data:`DDP_DEFAULTS` are PyTorch's own defaults, read from its
source (``torch/nn/parallel/distributed.py``, torch 2.13).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from utils.parallel.network import ring_allreduce_time
from utils.validate import check_nonnegative, check_positive

MIB = 1024 * 1024

DDP_DEFAULTS = {
    # torch.nn.parallel.DistributedDataParallel(bucket_cap_mb=None) means 25 MiB
    # (_DEFAULT_BUCKET_CAP_MB = 25 in torch/nn/parallel/distributed.py).
    "bucket_cap_nbytes": 25 * MIB,
    # With bucket_cap_mb left at its default, the first bucket (the last layers'
    # gradients, ready first) is capped at 1 MiB so the first all-reduce starts
    # early (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = 1 MiB).
    "first_bucket_cap_nbytes": 1 * MIB,
}
"""PyTorch DDP's default bucket caps, in bytes (source: torch/nn/parallel/distributed.py)."""


def _check_sizes(grad_nbytes: Sequence[float]) -> None:
    if len(grad_nbytes) == 0:
        raise ValueError("grad_nbytes is empty; give one gradient size (bytes) per unit, in forward order")
    for i, n in enumerate(grad_nbytes):
        check_nonnegative(f"grad_nbytes[{i}] (bytes)", n, finite=True)


def _check_cap(name: str, cap: float) -> None:
    check_positive(f"{name} (bytes; float('inf') for a single bucket)", cap)


def assign_buckets(
    grad_nbytes: Sequence[float],
    bucket_cap_nbytes: float = DDP_DEFAULTS["bucket_cap_nbytes"],
    first_bucket_cap_nbytes: float | None = None,
) -> list[list[int]]:
    """Group gradients into all-reduce buckets in the order backward produces them.

    ``grad_nbytes[i]`` is the gradient size in bytes of unit ``i`` (a parameter
    or a layer) in *forward* order; backward produces them from the last to the
    first. Walking in that order, each gradient joins the open bucket, and the
    bucket closes as soon as its size reaches the cap (``size >= cap``), so a
    bucket can exceed the cap by its last gradient. The first bucket uses
    ``first_bucket_cap_nbytes`` when given, the others ``bucket_cap_nbytes``.
    This is DDP's rule (``compute_bucket_assignment_by_size`` in
    ``torch/csrc/distributed/c10d/reducer.cpp``; tested against it).

    Returns the buckets in launch order, each a list of unit indices in the
    order their gradients become ready. ``bucket_cap_nbytes=float('inf')``
    gives one bucket: no overlap at all.
    """
    _check_sizes(grad_nbytes)
    _check_cap("bucket_cap_nbytes", bucket_cap_nbytes)
    if first_bucket_cap_nbytes is not None:
        _check_cap("first_bucket_cap_nbytes", first_bucket_cap_nbytes)
    cap = bucket_cap_nbytes if first_bucket_cap_nbytes is None else first_bucket_cap_nbytes
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0.0
    for i in reversed(range(len(grad_nbytes))):
        current.append(i)
        size += grad_nbytes[i]
        if size >= cap:
            buckets.append(current)
            current, size, cap = [], 0.0, bucket_cap_nbytes
    if current:
        buckets.append(current)
    return buckets


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
) -> DDPTimeline:
    """Backward plus bucketed gradient all-reduce, overlapped the way DDP schedules it.

    Units are given in forward order: ``backward_seconds[i]`` and
    ``grad_nbytes[i]`` belong to unit ``i``; backward runs ``L-1, ..., 0``. With
    buckets ``b = 1, 2, ...`` from :func:`assign_buckets`:

    - ``ready_b`` = time the last gradient of bucket ``b`` is ready;
    - ``start_b = max(ready_b, end_{b-1})`` (one all-reduce at a time, in order);
    - ``end_b = start_b + ring_allreduce_time(n_gpus, nbytes_b, bandwidth, latency)``;
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
    for i, s in enumerate(backward_seconds):
        check_nonnegative(f"backward_seconds[{i}] (seconds of compute)", s, finite=True)
    # Validate the link once, even for a model whose buckets are all empty.
    ring_allreduce_time(n_gpus, 0.0, bandwidth_bytes_per_s, latency_seconds)
    buckets = assign_buckets(grad_nbytes, bucket_cap_nbytes, first_bucket_cap_nbytes)

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
        duration = ring_allreduce_time(n_gpus, nbytes, bandwidth_bytes_per_s, latency_seconds)
        start = max(ready_b, link_free)
        link_free = start + duration
        comm += duration
        times.append(BucketTimes(tuple(units), nbytes, ready_b, start, link_free))
    return DDPTimeline(tuple(ready), tuple(times), compute, comm, max(compute, link_free))
