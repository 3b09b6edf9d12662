"""Part 6 benchmark: the fused linear + cross-entropy and the fused AdamW step, on a GPU.

Run from the repository root on a machine with a CUDA GPU, torch and triton (no Jupyter)::

    python -m benchmarks.training_kernels            # full sizes
    python -m benchmarks.training_kernels --quick    # a smaller vocabulary

Each case is checked against its reference first, then timed with :func:`utils.bench.time_seconds`:

- **fused linear + cross-entropy** (:func:`utils.kernels.fused_linear_cross_entropy.fused_linear_cross_entropy`)
  at Llama 3 8B's output layer: 8,192 tokens of width 4,096, vocabulary 128,256, bf16, chunks of 1,024
  tokens; forward and backward, in TFLOP/s of the ``6 N d V`` of its three matmuls, against
  ``F.cross_entropy(hidden @ weight.T, targets)`` forward and backward. Both runs' peak memory
  (``torch.cuda.max_memory_allocated`` above the inputs) is in the row's target text: the chapter's claim is
  the memory, the time is reported.
- **fused AdamW** (``torch.optim.AdamW(fused=True)``) over 256 Mi fp32 parameters in 16 tensors, in GB/s of
  the 28 bytes per parameter a one-pass step moves (:mod:`utils.production.fused_training`), against
  ``foreach=True`` on the same bytes (so the ratio is the speed-up; ``foreach`` moves 80): target >= 70 %
  of peak HBM.

Without a GPU the script refuses (exit code 2) unless ``--allow-cpu`` is given, which runs tiny shapes
(the loss through Triton's interpreter) as a smoke test.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import utils  # noqa: F401  (first: switches Triton to its interpreter when there is no GPU)
import torch
import torch.nn.functional as F

from benchmarks.common import Result, rate_and_fraction, run
from utils import device
from utils.bench import time_seconds
from utils.gpu.hardware import GpuSpec
from utils.kernels.fused_linear_cross_entropy import fused_linear_cross_entropy
from utils.production.fused_training import adamw_bytes_per_param

TARGET_ADAMW_FRACTION = 0.70


@dataclass(frozen=True)
class Sizes:
    loss: tuple[int, int, int, int]   # tokens, hidden, vocabulary, chunk
    adamw: tuple[int, int]            # tensors, elements per tensor
    repeats: int


FULL = Sizes((8192, 4096, 128_256, 1024), (16, 1 << 24), repeats=10)
QUICK = Sizes((8192, 4096, 32_000, 1024), (16, 1 << 22), repeats=10)
CPU_SMOKE = Sizes((64, 16, 300, 16), (4, 1 << 10), repeats=1)


def _peak_bytes(fn) -> int | None:
    """Bytes allocated at the peak of ``fn()`` above what was allocated before it (None without CUDA)."""
    if not torch.cuda.is_available():
        fn()
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def bench_fused_loss(sizes: Sizes, gpu: GpuSpec | None, on_gpu: bool) -> Result:
    """Forward and backward of the output layer's loss: fused (chunked, gradients in forward) against eager."""
    n, d, v, chunk = sizes.loss
    dtype = torch.bfloat16 if on_gpu else torch.float32
    dev = device.device()
    hidden = (torch.randn(n, d, device=dev, dtype=dtype)).requires_grad_()
    weight = (torch.randn(v, d, device=dev, dtype=dtype) / d**0.5).requires_grad_()
    targets = torch.randint(0, v, (n,), device=dev)

    def fused():
        fused_linear_cross_entropy(hidden, weight, targets, chunk_size=chunk).backward()

    def eager():
        F.cross_entropy((hidden @ weight.T).float(), targets).backward()

    grads = []
    for fn in (fused, eager):
        hidden.grad = weight.grad = None
        fn()
        grads.append((hidden.grad.float(), weight.grad.float()))
    tol = dict(rtol=2e-2, atol=2e-3) if on_gpu else dict(rtol=1e-4, atol=1e-5)
    for mine, ref in zip(*grads):
        torch.testing.assert_close(mine, ref, **tol)
    peaks = []
    for fn in (fused, eager):
        hidden.grad = weight.grad = None
        peaks.append(_peak_bytes(fn))
    flops = 6 * n * d * v
    peak = gpu.flops("bf16") if gpu else None
    value, fraction = rate_and_fraction(time_seconds(fused, warmup=1, repeats=sizes.repeats), flops, "TFLOP/s", peak)
    baseline, _ = rate_and_fraction(time_seconds(eager, warmup=1, repeats=sizes.repeats), flops, "TFLOP/s", peak)
    memory = ("peak memory: fused %.2f GB, eager %.2f GB" % (peaks[0] / 1e9, peaks[1] / 1e9)
              if peaks[0] is not None else "peak memory: needs CUDA")
    shape = f"N={n}, d={d}, V={v}, chunk {chunk}, {str(dtype).split('.')[-1]}"
    return Result("fused linear + cross-entropy", shape, "TFLOP/s", value,
                  "F.cross_entropy(hidden @ weight.T), fp32 loss", baseline, fraction, f"reported; {memory}", "n/a",
                  intensity=None)


def bench_fused_adamw(sizes: Sizes, gpu: GpuSpec | None, on_gpu: bool) -> Result:
    """One AdamW step: fused against foreach, both in GB/s of the one-pass step's 28 bytes per parameter."""
    count, numel = sizes.adamw
    dev = device.device()
    torch.manual_seed(0)
    start = [torch.randn(numel, device=dev) for _ in range(count)]
    grads = [torch.randn(numel, device=dev) for _ in range(count)]
    seconds = {}
    for impl in ("fused", "foreach"):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        for p, g in zip(params, grads):
            p.grad = g
        opt = torch.optim.AdamW(params, lr=1e-3, **{impl: True})
        opt.step()
        seconds[impl] = time_seconds(opt.step, warmup=1, repeats=sizes.repeats)
    check = [torch.nn.Parameter(p.clone()) for p in start[:1]]
    ref = [torch.nn.Parameter(p.clone()) for p in start[:1]]
    for params, impl in ((check, "fused"), (ref, "foreach")):
        params[0].grad = grads[0]
        torch.optim.AdamW(params, lr=1e-3, **{impl: True}).step()
    torch.testing.assert_close(check[0], ref[0], rtol=1e-5, atol=1e-6)
    nbytes = count * numel * adamw_bytes_per_param("fused")
    peak = gpu.hbm_bandwidth if gpu else None
    value, fraction = rate_and_fraction(seconds["fused"], nbytes, "GB/s", peak)
    baseline, _ = rate_and_fraction(seconds["foreach"], nbytes, "GB/s", peak)
    verdict = "n/a"
    if on_gpu and fraction is not None:
        verdict = "PASS" if fraction >= TARGET_ADAMW_FRACTION else "MISS"
    return Result("fused AdamW step", f"{count} x {numel} fp32 parameters", "GB/s", value,
                  "AdamW(foreach=True), same 28 B/param", baseline, fraction,
                  f">= {TARGET_ADAMW_FRACTION:.0%} of peak HBM (28 B/param)", verdict,
                  intensity=12 / 28)  # about 12 FLOPs of element-wise arithmetic per parameter


def cases(on_gpu: bool, quick: bool, gpu: GpuSpec | None) -> list[Result]:
    """The fused loss, then the fused optimizer step."""
    sizes = (QUICK if quick else FULL) if on_gpu else CPU_SMOKE
    return [bench_fused_loss(sizes, gpu, on_gpu), bench_fused_adamw(sizes, gpu, on_gpu)]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit code (0 done, 1 a target missed with --strict, 2 no GPU)."""
    return run("benchmarks.training_kernels", __doc__.split("\n")[0], cases, argv)


if __name__ == "__main__":
    sys.exit(main())
