"""The one benchmark harness: every single-GPU lab kernel against its baseline, one table, recorded.

Run from the repository root on a machine with a CUDA GPU, torch and triton (no Jupyter)::

    python -m benchmarks            # full sizes (~3 minutes on an H100); writes benchmarks/results/<gpu>.json
    python -m benchmarks --quick    # smaller sizes; writes benchmarks/results/<gpu>-quick.json
    python -m benchmarks --record DIR   # write the JSON and the roofline PNG to DIR instead

It runs the cases of :mod:`benchmarks.gpu_architecture` (HBM copy, vector add, fused
softmax, tiled matmul against cuBLAS), :mod:`benchmarks.attention` (FlashAttention
against every SDPA backend and naive attention, RMSNorm, RoPE, the SwiGLU gate),
:mod:`benchmarks.hopper_kernels`, :mod:`benchmarks.decode_kernels` (split-KV decode
against the unsplit paged kernel, the int4 matmul against torch) and :mod:`benchmarks.serving_engine`
(the engine's decode tokens/s at batch 64 on a 1.1B model against the roofline bound),
:mod:`benchmarks.training_kernels` (part 6: the fused linear + cross-entropy and the fused AdamW step), each
checked against its reference before it is timed with ``triton.testing.do_bench`` (the engine: its own steps)
(median, L2 flushed between runs, inputs of 1 GiB or more for the memory-bound kernels).
It prints the header (GPU, driver's name, date, versions, peaks) and one table, and
records both as JSON with a roofline of every kernel (``<gpu>-roofline.png``).

On a machine with two GPUs or more it ends with :mod:`benchmarks.collectives`: all-reduce,
all-gather and reduce-scatter over every GPU (NCCL), as bus bandwidth against NVLink. The
other multi-process scripts (``torchrun -m benchmarks.ring_all_reduce`` and those in
``benchmarks/README.md``) compare the book's own implementations with the library's.
"""

from __future__ import annotations

import sys

from benchmarks import (attention, collectives, decode_kernels, gpu_architecture, hopper_kernels, serving_engine,
                        training_kernels)
from benchmarks.common import Result, run
from utils.gpu.hardware import GpuSpec

_NO_GPU_YET = "added with part 5 (issue 25) in a session without a GPU; not yet run on an H100"
NOT_YET_RECORDED: dict[str, str] = {
    "split-KV paged decode": _NO_GPU_YET,
    "int4 matmul (decode)": _NO_GPU_YET,
    "int8 matmul (decode)": _NO_GPU_YET,
    "serving engine decode": _NO_GPU_YET,
    "serving engine decode (per-request attention loop)": _NO_GPU_YET,
    "fused linear + cross-entropy": "added with part 6 (issue 34) in a session without a GPU; not yet run on a GPU",
    "fused AdamW step": "added with part 6 (issue 34) in a session without a GPU; not yet run on a GPU",
}
"""Cases the harness runs that ``benchmarks/results/h100-sxm.json`` does not hold yet, and why. The next run of
``python -m benchmarks`` on an H100 records them; then empty this (``tests/test_benchmarks_harness.py`` checks
both ways)."""


def cases(on_gpu: bool, quick: bool, gpu: GpuSpec | None) -> list[Result]:
    """Part 1's cases, then part 3's, then the Hopper kernels, then part 5's decode kernels and serving engine,
    then part 6's training kernels, then the collectives (with two GPUs or more)."""
    return (gpu_architecture.cases(on_gpu, quick, gpu) + attention.cases(on_gpu, quick, gpu)
            + hopper_kernels.cases(on_gpu, quick, gpu) + decode_kernels.cases(on_gpu, quick, gpu)
            + serving_engine.cases(on_gpu, quick, gpu) + training_kernels.cases(on_gpu, quick, gpu)
            + collectives.cases(on_gpu, quick, gpu))


def main(argv: list[str] | None = None) -> int:
    """Run every case; return the exit code (0 done, 1 a target missed with --strict, 2 no GPU)."""
    return run("benchmarks", __doc__.split("\n")[0], cases, argv, record_dir="benchmarks/results")


if __name__ == "__main__":
    sys.exit(main())
