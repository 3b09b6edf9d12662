"""Timing kernels honestly, and turning bytes and FLOPs into rates.

On a GPU, kernel launches are asynchronous: timing with ``time.time()`` around a
call measures the launch, not the work. :func:`time_seconds` therefore uses
``triton.testing.do_bench``, which synchronises, flushes the L2 cache between
runs and reports a quantile of many repeats; on a GPU machine without Triton
(Windows) it times each call with CUDA events instead. On a CPU it warms up, then
takes the median of repeated wall-clock runs. CPU timings under Triton's interpreter
say nothing about GPU speed; pages print :data:`utils.device.INTERPRETER` beside them.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

from utils import device as _device
from utils.validate import check_nonnegative, check_nonnegative_int, check_positive, check_positive_int


def time_seconds(fn: Callable[[], object], warmup: int = 3, repeats: int = 10, wall_clock: bool = False) -> float:
    """Median wall-clock seconds of one call of ``fn()``.

    GPU: ``triton.testing.do_bench(fn, return_mode="median")`` (milliseconds,
    converted to seconds); ``warmup`` and ``repeats`` are then ignored in favour
    of do_bench's own time-based counts. GPU without Triton: ``warmup`` calls,
    then the median of ``repeats`` calls each timed by a pair of CUDA events
    (no L2 flush between them). CPU: ``warmup`` calls, then the median
    of ``repeats`` timed calls. ``wall_clock=True`` takes the CPU path on a GPU
    machine too: do_bench times the GPU's stream with CUDA events, which sees
    none of the work ``fn`` does on the CPU.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    check_nonnegative_int("warmup", warmup)
    check_positive_int("repeats", repeats)
    if _device.HAS_CUDA and not wall_clock:
        if not _device.HAS_TRITON:
            return _cuda_event_seconds(fn, warmup, repeats)
        import triton.testing

        return triton.testing.do_bench(fn, return_mode="median") * 1e-3
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _cuda_event_seconds(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    """Median seconds of ``fn()`` on the current CUDA stream, each call between two recorded CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(samples)


def _check_rate_args(amount: float, seconds: float, what: str) -> None:
    check_nonnegative(what, amount)
    check_positive("seconds", seconds)


def gb_per_s(nbytes: float, seconds: float) -> float:
    """Bandwidth in GB/s (10^9 bytes per second): ``nbytes / seconds / 1e9``."""
    _check_rate_args(nbytes, seconds, "nbytes")
    return nbytes / seconds / 1e9


def tflop_per_s(flops: float, seconds: float) -> float:
    """Throughput in TFLOP/s (10^12 floating-point operations per second): ``flops / seconds / 1e12``."""
    _check_rate_args(flops, seconds, "flops")
    return flops / seconds / 1e12


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m x k) @ (k x n) matmul: ``2 m n k`` (one multiply and one add per term)."""
    for name, size in (("m", m), ("n", n), ("k", k)):
        check_positive_int(name, size)
    return 2 * m * n * k
