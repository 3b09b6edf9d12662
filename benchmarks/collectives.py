"""Collectives in the harness: bus bandwidth of all-reduce, all-gather and reduce-scatter over every GPU here.

``python -m benchmarks`` runs these cases when the machine has two GPUs or more: one process per GPU
(:func:`utils.dist.launch` with NCCL), each collective on a message of ``nbytes`` (the whole buffer of an
all-reduce; the whole gathered or scattered array of the other two, as nccl-tests counts it), timed as the
median over ``repeats`` runs of the slowest rank, with a barrier and a device synchronisation around each.
The rate is the bus bandwidth, ``algbw * factor`` (nccl-tests' doc/PERFORMANCE.md:
:func:`utils.parallel.comm.bandwidth.bus_bandwidth`), compared with the NVLink bandwidth per direction from the
datasheet (:mod:`utils.gpu.hardware`, half of its bidirectional total). With one GPU there is nothing to
measure and the harness says so. ``--allow-cpu`` runs two gloo processes on tiny messages as a smoke test.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from benchmarks.common import Result
from utils.dist import launch
from utils.dist_policy import worker_device
from utils.gpu.hardware import GpuSpec
from utils.parallel.comm.bandwidth import algorithm_bandwidth, bus_bandwidth

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
FULL_BYTES, QUICK_BYTES, CPU_SMOKE_BYTES = 2**30, 2**26, 2**16
CPU_SMOKE_RANKS = 2


def median_collective_seconds(fn, repeats: int, on_cuda: bool) -> float:
    """Median seconds of ``fn()`` on this rank, then the maximum over ranks: a collective ends with its slowest rank."""
    fn()  # warm-up: NCCL builds its rings and buffers on the first call
    samples = []
    for _ in range(repeats):
        if on_cuda:
            torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        fn()
        if on_cuda:
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    slowest = torch.tensor([statistics.median(samples)], device=worker_device())
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.item()


def collective_worker(rank: int, world_size: int, nbytes: int, repeats: int) -> dict[str, float]:
    """Seconds per call of each collective of :data:`COLLECTIVES` on an ``nbytes`` fp32 message, on every rank."""
    dev = worker_device()
    on_cuda = dev.type == "cuda"
    n = nbytes // 4 // world_size * world_size  # divisible into world_size pieces
    full = torch.ones(n, device=dev)
    piece = torch.ones(n // world_size, device=dev)
    calls = {
        "all_reduce": lambda: dist.all_reduce(full),
        "all_gather": lambda: dist.all_gather_into_tensor(full, piece),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(piece, full),
    }
    return {name: median_collective_seconds(call, repeats, on_cuda) for name, call in calls.items()}


def cases(on_gpu: bool, quick: bool, gpu: GpuSpec | None) -> list[Result]:
    """One row per collective over every GPU of the machine; none with fewer than two GPUs."""
    if on_gpu:
        world = torch.cuda.device_count()
        if world < 2:
            print(f"Collectives: skipped, this machine has {world} GPU (they need two or more).")
            return []
        nbytes, backend, repeats = (QUICK_BYTES if quick else FULL_BYTES), "nccl", 20
    else:
        world, nbytes, backend, repeats = CPU_SMOKE_RANKS, CPU_SMOKE_BYTES, "gloo", 3
    seconds = launch(collective_worker, world, nbytes, repeats, backend=backend, timeout=600)[0]
    per_direction = gpu.nvlink_bandwidth / 2 if gpu else None
    rows = []
    for name in COLLECTIVES:
        busbw = bus_bandwidth(name, algorithm_bandwidth(nbytes // 4 // world * world * 4, seconds[name]), world)
        rows.append(Result(
            f"{name.replace('_', '-')} ({backend})", f"{nbytes / 2**20:g} MiB fp32, {world} ranks", "GB/s busbw",
            busbw / 1e9, "NVLink per direction (datasheet)",
            per_direction / 1e9 if per_direction else float("nan"),
            busbw / per_direction if per_direction else None, "reported only", "n/a"))
    return rows
