"""Part 3 benchmark: FlashAttention, RMSNorm and RoPE in Triton against PyTorch, on a GPU.

Run from the repository root, on a machine with a CUDA GPU, torch and triton
(no Jupyter needed)::

    python -m benchmarks.attention                  # full sizes
    python -m benchmarks.attention --quick          # smaller sizes
    python -m benchmarks.attention --json out.json  # also save the results

Each kernel's output is checked against its reference first; then every case
is timed with :func:`utils.bench.time_seconds` (``triton.testing.do_bench``:
median, L2 flushed between runs) and printed in the table of
``benchmarks.gpu_architecture`` (rate, fraction of the chip's peak, ratio to
the baseline, PASS/MISS against part 3's targets on an H100 SXM):

- FlashAttention forward (:func:`utils.kernels.flash_attention`), fp16,
  non-causal, head_dim 128, sequence >= 4096: >= 1.0x SDPA's FlashAttention-2
  backend and >= 70% of the fastest SDPA backend. Every SDPA backend is timed
  and named (``torch.nn.attention.SDPBackend``), and so is naive attention;
  FLOPs are ``4 b h n^2 d`` (two matmuls of a non-causal forward).
- RMSNorm and RoPE (:mod:`utils.kernels.llama_ops`), fp16, 1 GiB inputs
  (well past L2): >= 80% of peak HBM bandwidth, bytes = one read + one write.

Without a GPU the script refuses (exit code 2) unless ``--allow-cpu`` is given,
which runs tiny shapes through Triton's interpreter as a smoke test.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import utils  # noqa: F401  (first: switches Triton to its interpreter when there is no GPU)
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.common import Result, rate_and_fraction, run
from utils import device
from utils.attention.flash_reference import attention_reference
from utils.attention.llama import apply_rope, rms_norm as rms_norm_reference, rope_angles
from utils.bench import time_seconds
from utils.gpu.hardware import GpuSpec
from utils.kernels.flash_attention import flash_attention
from utils.kernels.llama_ops import rms_norm, rope

TARGET_FLASH_VS_SDPA_FLASH = 1.0
TARGET_FLASH_VS_FASTEST_SDPA = 0.70
TARGET_ELEMENTWISE_BANDWIDTH_FRACTION = 0.80
SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")


@dataclass(frozen=True)
class Sizes:
    batch: int
    heads: int
    seq_lens: tuple[int, ...]
    head_dim: int
    norm_rows: int
    norm_cols: int
    rope_shape: tuple[int, int, int, int]
    repeats: int


FULL = Sizes(4, 16, (4096, 8192), 128, 2**16, 8192, (16, 32, 8192, 128), repeats=10)  # norm, rope: 1 GiB fp16
QUICK = Sizes(2, 16, (4096,), 128, 2**14, 8192, (4, 32, 4096, 128), repeats=10)
CPU_SMOKE = Sizes(1, 2, (48,), 16, 8, 64, (1, 2, 16, 16), repeats=1)


def _time(fn, sizes: Sizes) -> float:
    return time_seconds(fn, warmup=1 if sizes.repeats == 1 else 3, repeats=sizes.repeats)


def _sdpa_seconds(q, k, v, backend: str, sizes: Sizes) -> float | None:
    """Median seconds of SDPA forced onto one backend, or None where it cannot run these inputs here."""
    try:
        with sdpa_kernel(getattr(SDPBackend, backend)):
            F.scaled_dot_product_attention(q, k, v)
            return _time(lambda: F.scaled_dot_product_attention(q, k, v), sizes)
    except (RuntimeError, AttributeError):
        return None


def bench_flash(sizes: Sizes, seq_len: int, gpu: GpuSpec | None, on_gpu: bool) -> list[Result]:
    """Our FlashAttention forward against each SDPA backend and naive attention (one row each)."""
    b, h, n, d = sizes.batch, sizes.heads, seq_len, sizes.head_dim
    dtype = torch.float16 if on_gpu else torch.float32
    q, k, v = (torch.randn(b, h, n, d, device=device.device(), dtype=dtype) for _ in range(3))
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.float16 else dict(rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(flash_attention(q, k, v).float(), attention_reference(q.float(), k.float(), v.float()),
                               **tol)
    flops = 4 * b * h * n * n * d
    peak = gpu.flops("fp16") if gpu else None
    shape = f"b{b} h{h} n{n} d{d} {str(dtype).split('.')[-1]}"
    ours, fraction = rate_and_fraction(_time(lambda: flash_attention(q, k, v), sizes), flops, "TFLOP/s", peak)
    rates, unavailable = {}, []
    for backend in SDPA_BACKENDS:
        seconds = _sdpa_seconds(q, k, v, backend, sizes)
        if seconds is None:
            unavailable.append(backend)
        else:
            rates[f"SDPA {backend}"] = rate_and_fraction(seconds, flops, "TFLOP/s", peak)
    if unavailable:
        print(f"n={n}: SDPA backends that cannot run these inputs here: {', '.join(unavailable)}")
    rates["naive (S and P in HBM)"] = rate_and_fraction(
        _time(lambda: attention_reference(q, k, v), sizes), flops, "TFLOP/s", peak)
    flash_backend = rates.get("SDPA FLASH_ATTENTION", (float("nan"), None))[0]
    fastest = max((value for name, (value, _) in rates.items() if name.startswith("SDPA")), default=float("nan"))
    target = (f">= {TARGET_FLASH_VS_SDPA_FLASH:.1f}x SDPA FLASH_ATTENTION and "
              f">= {TARGET_FLASH_VS_FASTEST_SDPA:.0%} of the fastest SDPA backend")
    verdict = "n/a"
    if on_gpu and n >= 4096 and fastest == fastest:
        verdict = "PASS" if ours >= TARGET_FLASH_VS_SDPA_FLASH * flash_backend and \
            ours >= TARGET_FLASH_VS_FASTEST_SDPA * fastest else "MISS"
    rows = [Result("flash_attention fwd", shape, "TFLOP/s", ours, "SDPA FLASH_ATTENTION", flash_backend, fraction,
                   target, verdict)]
    rows += [Result(name, shape, "TFLOP/s", value, "flash_attention", ours, frac, "reported only", "n/a")
             for name, (value, frac) in rates.items()]
    return rows


def bench_rms_norm(sizes: Sizes, gpu: GpuSpec | None, on_gpu: bool) -> Result:
    """RMSNorm forward of a ``rows x cols`` matrix: one read and one write, against ``F.rms_norm``."""
    dtype = torch.float16 if on_gpu else torch.float32
    x = torch.randn(sizes.norm_rows, sizes.norm_cols, device=device.device(), dtype=dtype)
    w = torch.ones(sizes.norm_cols, device=device.device(), dtype=dtype)
    torch.testing.assert_close(rms_norm(x, w), rms_norm_reference(x, w), rtol=2e-3, atol=2e-3)
    nbytes = 2 * x.numel() * x.element_size()
    peak = gpu.hbm_bandwidth if gpu else None
    value, fraction = rate_and_fraction(_time(lambda: rms_norm(x, w), sizes), nbytes, "GB/s", peak)
    baseline, _ = rate_and_fraction(_time(lambda: F.rms_norm(x, (sizes.norm_cols,), w, eps=1e-6), sizes),
                                     nbytes, "GB/s", peak)
    return _bandwidth_result("rms_norm fwd", f"{sizes.norm_rows}x{sizes.norm_cols} {str(dtype).split('.')[-1]}",
                             value, "F.rms_norm", baseline, fraction, on_gpu)


def bench_rope(sizes: Sizes, gpu: GpuSpec | None, on_gpu: bool) -> Result:
    """RoPE of a ``(b, h, s, d)`` tensor: one read and one write, against the PyTorch reference ``apply_rope``."""
    dtype = torch.float16 if on_gpu else torch.float32
    x = torch.randn(sizes.rope_shape, device=device.device(), dtype=dtype)
    cos, sin = (t.to(device.device()) for t in rope_angles(sizes.rope_shape[2], sizes.rope_shape[3]))
    torch.testing.assert_close(rope(x, cos, sin), apply_rope(x, cos, sin), rtol=2e-3, atol=2e-3)
    nbytes = 2 * x.numel() * x.element_size()
    peak = gpu.hbm_bandwidth if gpu else None
    value, fraction = rate_and_fraction(_time(lambda: rope(x, cos, sin), sizes), nbytes, "GB/s", peak)
    baseline, _ = rate_and_fraction(_time(lambda: apply_rope(x, cos, sin), sizes), nbytes, "GB/s", peak)
    return _bandwidth_result("rope", "x".join(map(str, sizes.rope_shape)) + f" {str(dtype).split('.')[-1]}",
                             value, "apply_rope (torch)", baseline, fraction, on_gpu)


def _bandwidth_result(kernel, shape, value, baseline_name, baseline, fraction, on_gpu) -> Result:
    target = f">= {TARGET_ELEMENTWISE_BANDWIDTH_FRACTION:.0%} of peak HBM"
    verdict = "n/a" if fraction is None or not on_gpu else \
        ("PASS" if fraction >= TARGET_ELEMENTWISE_BANDWIDTH_FRACTION else "MISS")
    return Result(kernel, shape, "GB/s", value, baseline_name, baseline, fraction, target, verdict)


def cases(on_gpu: bool, quick: bool, gpu: GpuSpec | None) -> list[Result]:
    """FlashAttention at each sequence length (with every SDPA backend and naive attention), then RMSNorm and RoPE."""
    sizes = (QUICK if quick else FULL) if on_gpu else CPU_SMOKE
    results = [row for n in sizes.seq_lens for row in bench_flash(sizes, n, gpu, on_gpu)]
    return results + [bench_rms_norm(sizes, gpu, on_gpu), bench_rope(sizes, gpu, on_gpu)]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit code (0 done, 1 a target missed with --strict, 2 no GPU)."""
    return run("benchmarks.attention", __doc__.split("\n")[0], cases, argv)


if __name__ == "__main__":
    sys.exit(main())
