"""Part 1 benchmark: the three lab kernels against their PyTorch baselines, on a GPU.

Run from the repository root, on a machine with a CUDA GPU, torch and triton
(no Jupyter needed)::

    python -m benchmarks.gpu_architecture                 # full sizes
    python -m benchmarks.gpu_architecture --quick         # smaller sizes, a minute or less
    python -m benchmarks.gpu_architecture --json out.json # also save the results

It times each kernel of ``utils.kernels`` and its PyTorch baseline with
:func:`utils.bench.time_seconds` (``triton.testing.do_bench``: median, L2
flushed between runs), after checking that the kernel's output matches the
baseline's. It prints a header (GPU, date, versions, the peak figures used) and
a table: kernel, shape, GB/s or TFLOP/s, fraction of the chip's peak, ratio to
the baseline, and PASS/MISS against the lab's target:

- vector add, 2^28 fp32 elements: >= 85% of peak HBM bandwidth;
- fused softmax, R x N fp32, N in 1024..8192, R = max(4096, 2^28 / N) rows so that the
  input is at least 1 GiB (well past any L2): for N >= 2048, at least as fast as
  ``torch.softmax`` and >= 75% of peak HBM bandwidth (N = 1024 is reported without
  a target); then the persistent softmax (a grid sized from the compiled kernel's
  registers and shared memory) against it, reported only;
- tiled matmul, 4096^3 fp16: >= 80% of ``torch.matmul`` (cuBLAS); then the same
  kernel behind ``@triton.autotune``, reported with the configuration it chose.

Peaks come from :mod:`utils.gpu.hardware` (vendor datasheets), matched on the name
the driver reports (:func:`utils.gpu.hardware.spec_for_device`); for an unknown GPU the
fractions print as n/a. On a machine without a GPU the script refuses (exit
code 2) unless ``--allow-cpu`` is given, which runs tiny shapes through
Triton's interpreter as a smoke test: its timings say nothing about GPU speed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import utils  # noqa: F401  (first: switches Triton to its interpreter when there is no GPU)
import torch

from benchmarks.common import Result, rate_and_fraction, run
from utils import device
from utils.bench import matmul_flops, time_seconds
from utils.gpu.hardware import GpuSpec
from utils.gpu.roofline import SOFTMAX_FLOPS_PER_ELEMENT

TARGET_ADD_BANDWIDTH_FRACTION = 0.85
TARGET_SOFTMAX_BANDWIDTH_FRACTION = 0.75
TARGET_SOFTMAX_MIN_N_COLS = 2048
TARGET_MATMUL_VS_CUBLAS = 0.80
STRIDES = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Sizes:
    add_n_elements: int
    softmax_rows: int
    softmax_cols: tuple[int, ...]
    matmul_mnk: int
    repeats: int  # CPU only: time_seconds uses do_bench's own counts on a GPU
    softmax_min_bytes: int = 0  # more rows than softmax_rows where needed for an input this large

    def softmax_shape(self, n_cols: int) -> tuple[int, int]:
        """Rows and columns of the softmax input: at least ``softmax_rows`` rows and ``softmax_min_bytes`` of fp32."""
        return max(self.softmax_rows, self.softmax_min_bytes // (4 * n_cols)), n_cols


FULL = Sizes(2**28, 4096, (1024, 2048, 4096, 8192), 4096, repeats=10, softmax_min_bytes=2**30)
QUICK = Sizes(2**24, 1024, (1024, 2048, 4096, 8192), 2048, repeats=10)
CPU_SMOKE = Sizes(2**12, 4, (64, 256), 64, repeats=1)


def _time(fn: Callable[[], object], sizes: Sizes) -> float:
    return time_seconds(fn, warmup=1 if sizes.repeats == 1 else 3, repeats=sizes.repeats)


def bench_vector_add(sizes: Sizes, gpu: GpuSpec | None, on_gpu: bool) -> Result:
    """Vector add ``z = x + y`` in fp32: 3 * n * 4 bytes moved, against ``torch.add``."""
    from utils.kernels.vector_add import add

    n = sizes.add_n_elements
    x = torch.randn(n, device=device.device())
    y = torch.randn(n, device=device.device())
    torch.testing.assert_close(add(x, y), x + y)
    nbytes = 3 * n * x.element_size()
    peak = gpu.hbm_bandwidth if gpu else None
    value, fraction = rate_and_fraction(_time(lambda: add(x, y), sizes), nbytes, "GB/s", peak)
    baseline, _ = rate_and_fraction(_time(lambda: torch.add(x, y), sizes), nbytes, "GB/s", peak)
    target = f">= {TARGET_ADD_BANDWIDTH_FRACTION:.0%} of peak HBM"
    verdict = "n/a" if fraction is None or not on_gpu else \
        ("PASS" if fraction >= TARGET_ADD_BANDWIDTH_FRACTION else "MISS")
    return Result("vector add", f"2^{n.bit_length() - 1} fp32", "GB/s", value, "torch.add", baseline,
                  fraction, target, verdict, intensity=n / nbytes)


VECTOR_ADD_VARIANTS = {  # label: (BLOCK_SIZE, num_warps, offset in elements, elements short of a multiple of 16)
    "vector add, 1 element per thread (BLOCK 128, 4 warps)": (128, 4, 0, 0),
    "vector add, 1 element per thread (BLOCK 256, 8 warps)": (256, 8, 0, 0),
    "vector add, n not a multiple of 16": (1024, 4, 0, 1),
    "vector add, pointers offset by 4 bytes": (1024, 4, 1, 0),
}


def bench_vector_add_variants(sizes: Sizes, gpu: GpuSpec | None, default: Result) -> list[Result]:
    """The lab's vector add launched other ways, against its default launch (BLOCK 1024, 4 warps).

    One element per thread leaves each thread two loads in flight (x and y) instead of 16. An ``n``
    not divisible by 16, or pointers not 16-byte aligned, stops Triton from specialising the kernel
    on divisibility by 16, and its loads become 4 bytes wide instead of 16 (``ld.global.b32`` in the
    PTX instead of ``ld.global.v4.b32``).
    """
    import triton

    from utils.kernels.vector_add import add_kernel

    rows = []
    for label, (block, warps, offset, short) in VECTOR_ADD_VARIANTS.items():
        n = sizes.add_n_elements - short
        x, y = (torch.randn(n + offset, device=device.device())[offset:] for _ in range(2))
        z = torch.empty(n + offset, device=device.device())[offset:]

        def launch(x=x, y=y, z=z, n=n, block=block, warps=warps):
            add_kernel[(triton.cdiv(n, block),)](x, y, z, n, BLOCK_SIZE=block, num_warps=warps)

        launch()
        torch.testing.assert_close(z, x + y)
        nbytes = 3 * n * x.element_size()
        peak = gpu.hbm_bandwidth if gpu else None
        value, fraction = rate_and_fraction(_time(launch, sizes), nbytes, "GB/s", peak)
        rows.append(Result(label, f"{n:,} fp32", "GB/s", value, "vector add (BLOCK 1024, 4 warps)", default.value,
                           fraction, "reported only", "n/a"))
    return rows


def bench_softmax(sizes: Sizes, n_cols: int, gpu: GpuSpec | None, on_gpu: bool) -> Result:
    """Fused row softmax of an ``rows x n_cols`` fp32 matrix: one read and one write, against ``torch.softmax``."""
    from utils.kernels.softmax import softmax

    rows, n_cols = sizes.softmax_shape(n_cols)
    x = torch.randn(rows, n_cols, device=device.device())
    torch.testing.assert_close(softmax(x), torch.softmax(x, dim=-1))
    nbytes = 2 * rows * n_cols * x.element_size()
    peak = gpu.hbm_bandwidth if gpu else None
    value, fraction = rate_and_fraction(_time(lambda: softmax(x), sizes), nbytes, "GB/s", peak)
    baseline, _ = rate_and_fraction(_time(lambda: torch.softmax(x, dim=-1), sizes), nbytes, "GB/s", peak)
    if n_cols < TARGET_SOFTMAX_MIN_N_COLS:
        target, verdict = "none (reported only)", "n/a"
    else:
        target = f">= torch.softmax and >= {TARGET_SOFTMAX_BANDWIDTH_FRACTION:.0%} of peak HBM"
        verdict = "n/a" if fraction is None or not on_gpu else \
            ("PASS" if value >= baseline and fraction >= TARGET_SOFTMAX_BANDWIDTH_FRACTION else "MISS")
    return Result("fused softmax", f"{rows}x{n_cols} fp32", "GB/s", value, "torch.softmax", baseline,
                  fraction, target, verdict, intensity=SOFTMAX_FLOPS_PER_ELEMENT * rows * n_cols / nbytes)


def bench_softmax_persistent(sizes: Sizes, n_cols: int, gpu: GpuSpec | None, default: Result) -> Result:
    """The persistent softmax (:func:`utils.kernels.softmax.softmax_persistent`) on the same input as
    :func:`bench_softmax`, against the one-row-per-program kernel measured there."""
    from utils.kernels.softmax import softmax_persistent

    rows, n_cols = sizes.softmax_shape(n_cols)
    x = torch.randn(rows, n_cols, device=device.device())
    report: dict = {}
    torch.testing.assert_close(softmax_persistent(x, report=report), torch.softmax(x, dim=-1))
    nbytes = 2 * rows * n_cols * x.element_size()
    peak = gpu.hbm_bandwidth if gpu else None
    value, fraction = rate_and_fraction(_time(lambda: softmax_persistent(x), sizes), nbytes, "GB/s", peak)
    grid = f"{report['programs']} programs" + (
        f" ({report['blocks_per_sm']}/SM: {report['n_regs']} regs, {report['shared_bytes']} B smem, "
        f"{report['limiter']}-bound)" if report["n_regs"] is not None else "")
    return Result("persistent softmax", f"{rows}x{n_cols} fp32, {grid}", "GB/s", value,
                  "fused softmax (a program per row)", default.value, fraction, "reported only", "n/a",
                  intensity=default.intensity)


def _matmul_inputs(sizes: Sizes, gpu: GpuSpec | None, matmul_fn) -> tuple:
    """fp16 ``a`` and ``b`` of ``n x n``, checked through ``matmul_fn`` against fp32; their FLOPs and the fp16 peak."""
    n = sizes.matmul_mnk
    a = torch.randn(n, n, device=device.device()).half()
    b = torch.randn(n, n, device=device.device()).half()
    torch.testing.assert_close(matmul_fn(a, b).float(), (a.float() @ b.float()), atol=1e-1, rtol=1e-2)
    return a, b, matmul_flops(n, n, n), (gpu.flops("fp16") if gpu else None)


def bench_matmul_autotuned(sizes: Sizes, gpu: GpuSpec | None, default: Result) -> Result:
    """The tiled matmul behind ``@triton.autotune`` (:func:`utils.kernels.matmul.matmul_autotuned`), against
    ``torch.matmul``; the shape names the configuration the autotuner chose."""
    from utils.kernels.matmul import matmul_autotuned, matmul_kernel_autotuned

    n = sizes.matmul_mnk
    a, b, flops, peak = _matmul_inputs(sizes, gpu, matmul_autotuned)
    value, fraction = rate_and_fraction(_time(lambda: matmul_autotuned(a, b), sizes), flops, "TFLOP/s", peak)
    best = matmul_kernel_autotuned.best_config
    chosen = (f"{best.kwargs['BLOCK_M']}x{best.kwargs['BLOCK_N']}x{best.kwargs['BLOCK_K']}, "
              f"{best.num_warps} warps, {best.num_stages} stages")
    return Result("tiled matmul, autotuned", f"{n}^3 fp16, {chosen}", "TFLOP/s", value, "torch.matmul",
                  default.baseline_value, fraction, "reported only", "n/a", intensity=default.intensity)


def bench_matmul(sizes: Sizes, gpu: GpuSpec | None, on_gpu: bool) -> Result:
    """Tiled fp16 matmul at ``n^3`` with the module's default tiles, against ``torch.matmul`` (cuBLAS on a GPU)."""
    from utils.kernels.matmul import matmul

    n = sizes.matmul_mnk
    a, b, flops, peak = _matmul_inputs(sizes, gpu, matmul)
    value, fraction = rate_and_fraction(_time(lambda: matmul(a, b), sizes), flops, "TFLOP/s", peak)
    baseline, _ = rate_and_fraction(_time(lambda: torch.matmul(a, b), sizes), flops, "TFLOP/s", peak)
    verdict = "n/a" if not on_gpu else ("PASS" if value >= TARGET_MATMUL_VS_CUBLAS * baseline else "MISS")
    return Result("tiled matmul", f"{n}^3 fp16", "TFLOP/s", value, "torch.matmul", baseline, fraction,
                  f">= {TARGET_MATMUL_VS_CUBLAS:.0%} of torch.matmul", verdict, intensity=flops / (3 * n * n * 2))


def bench_copy(sizes: Sizes, gpu: GpuSpec | None) -> Result:
    """``dst.copy_(src)`` of ``4 * add_n_elements`` bytes: the HBM bandwidth a plain copy reaches, against the datasheet."""
    n = sizes.add_n_elements
    src = torch.randn(n, device=device.device())
    dst = torch.empty_like(src)
    nbytes = 2 * n * src.element_size()  # read once, written once
    peak = gpu.hbm_bandwidth if gpu else None
    value, fraction = rate_and_fraction(_time(lambda: dst.copy_(src), sizes), nbytes, "GB/s", peak)
    return Result("HBM copy (torch copy_)", f"2^{n.bit_length() - 1} fp32", "GB/s", value, "datasheet peak",
                  peak / 1e9 if peak else float("nan"), fraction, "reported only", "n/a")


def bench_strided_copy(sizes: Sizes, gpu: GpuSpec | None, stride: int) -> Result:
    """Copy every ``stride``-th fp32 of a buffer into a contiguous one (chapter "The memory hierarchy").

    The rate counts the useful bytes (each kept float read once, written once); with stride s >= 8 a
    32-byte sector brings one useful float of 4 bytes, so HBM moves up to (1 + 8) / 2 times more.
    """
    n = sizes.add_n_elements // 4
    src = torch.ones(n * stride, device=device.device())
    dst = torch.empty(n, device=device.device())
    view = src[::stride]
    nbytes = 2 * n * 4
    peak = gpu.hbm_bandwidth if gpu else None
    value, fraction = rate_and_fraction(_time(lambda: dst.copy_(view), sizes), nbytes, "GB/s", peak)
    return Result(f"strided copy, stride {stride}", f"2^{n.bit_length() - 1} fp32", "GB/s", value,
                  "datasheet peak", peak / 1e9 if peak else float("nan"), fraction, "reported only", "n/a")


def cases(on_gpu: bool, quick: bool, gpu: GpuSpec | None) -> list[Result]:
    """A plain copy, strided copies, vector add (and its launch variants), the fused softmax at each width, the
    persistent softmax at each width, and the tiled matmul (default tiles, then autotuned), in that order."""
    sizes = (QUICK if quick else FULL) if on_gpu else CPU_SMOKE
    results = [bench_copy(sizes, gpu)] + [bench_strided_copy(sizes, gpu, s) for s in STRIDES]
    results.append(bench_vector_add(sizes, gpu, on_gpu))
    results += bench_vector_add_variants(sizes, gpu, results[-1])
    softmax_rows = [bench_softmax(sizes, n_cols, gpu, on_gpu) for n_cols in sizes.softmax_cols]
    results += softmax_rows
    results += [bench_softmax_persistent(sizes, n_cols, gpu, row)
                for n_cols, row in zip(sizes.softmax_cols, softmax_rows)]
    results.append(bench_matmul(sizes, gpu, on_gpu))
    results.append(bench_matmul_autotuned(sizes, gpu, results[-1]))
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit code (0 done, 1 a target missed with --strict, 2 no GPU)."""
    return run("benchmarks.gpu_architecture", __doc__.split("\n")[0], cases, argv)


if __name__ == "__main__":
    sys.exit(main())
