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
from utils.gpu.memory_hierarchy import sm_clock_hz
from utils.gpu.roofline import attention_intensity
from utils.kernels.flash_attention import flash_attention
from utils.kernels.llama_ops import rms_norm, rope, swiglu_gate
from utils.kernels.sfu import SFU_OPS_PER_CLOCK_PER_SM, exp2_chain, exp2_chain_reference

TARGET_FLASH_VS_SDPA_FLASH = 1.0
TARGET_FLASH_VS_FASTEST_SDPA = 0.70
TARGET_ELEMENTWISE_BANDWIDTH_FRACTION = 0.80
FA3_H100_SFU_TFLOPS = 3.9  # Shah et al. 2024, arXiv:2407.08608, section 3.1: "3.9 TFLOPS of special functions"
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
    exp2_elements: int = 2**24
    exp2_iters: int = 1024
    paged: tuple[int, int, int, int, int, int] = (64, 4096, 32, 8, 128, 16)  # seqs, tokens, heads, KV heads, d, block


FULL = Sizes(4, 16, (4096, 8192), 128, 2**16, 8192, (16, 32, 8192, 128), repeats=10)  # norm, rope: 1 GiB fp16
QUICK = Sizes(2, 16, (4096,), 128, 2**14, 8192, (4, 32, 4096, 128), repeats=10, paged=(16, 4096, 32, 8, 128, 16))
CPU_SMOKE = Sizes(1, 2, (48,), 16, 8, 64, (1, 2, 16, 16), repeats=1, exp2_elements=256, exp2_iters=4,
                  paged=(3, 40, 4, 2, 16, 16))


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
    intensity = attention_intensity(n, d, q.element_size(), fused=True)  # read Q, K, V and write O once
    rows = [Result("flash_attention fwd", shape, "TFLOP/s", ours, "SDPA FLASH_ATTENTION", flash_backend, fraction,
                   target, verdict, intensity=intensity)]
    rows += [Result(name, shape, "TFLOP/s", value, "flash_attention", ours, frac, "reported only", "n/a",
                    intensity=attention_intensity(n, d, q.element_size(), fused=False) if _materialises(name)
                    else intensity)
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
                             value, "F.rms_norm", baseline, fraction, on_gpu, 4 * x.numel() / nbytes)


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
                             value, "apply_rope (torch)", baseline, fraction, on_gpu, 3 * x.numel() / nbytes)


def bench_swiglu_gate(sizes: Sizes, gpu: GpuSpec | None, on_gpu: bool) -> Result:
    """SwiGLU's gate ``silu(a) * b``: two reads and one write, against the two PyTorch ops."""
    dtype = torch.float16 if on_gpu else torch.float32
    a, b = (torch.randn(sizes.norm_rows, sizes.norm_cols, device=device.device(), dtype=dtype) for _ in range(2))
    torch.testing.assert_close(swiglu_gate(a, b), F.silu(a) * b, rtol=2e-3, atol=2e-3)
    nbytes = 3 * a.numel() * a.element_size()
    peak = gpu.hbm_bandwidth if gpu else None
    value, fraction = rate_and_fraction(_time(lambda: swiglu_gate(a, b), sizes), nbytes, "GB/s", peak)
    baseline, _ = rate_and_fraction(_time(lambda: F.silu(a) * b, sizes), nbytes, "GB/s", peak)
    return _bandwidth_result("swiglu gate", f"{sizes.norm_rows}x{sizes.norm_cols} {str(dtype).split('.')[-1]}",
                             value, "F.silu(a) * b", baseline, fraction, on_gpu, 5 * a.numel() / nbytes)


def bench_exp2(sizes: Sizes, gpu: GpuSpec | None, on_gpu: bool) -> Result:
    """Exponentials per second on the SFUs (``utils.kernels.sfu``), against their peak and FlashAttention-3's figure."""
    n, iters = sizes.exp2_elements, sizes.exp2_iters
    x = 0.01 * torch.rand(n, device=device.device())
    torch.testing.assert_close(exp2_chain(x, iters), exp2_chain_reference(x, iters), rtol=1e-4, atol=1e-3)
    value = n * iters / _time(lambda: exp2_chain(x, iters), sizes) / 1e12
    peak = None
    if gpu:
        peak = gpu.sm_count * SFU_OPS_PER_CLOCK_PER_SM * sm_clock_hz(gpu.name) / 1e12
    return Result("exp2 (SFU)", f"2^{n.bit_length() - 1} fp32 x {iters}", "T exp2/s", value,
                  "FlashAttention-3 paper: H100 special functions", FA3_H100_SFU_TFLOPS,
                  value / peak if peak else None, "reported only", "n/a")


def bench_paged_decode(sizes: Sizes, gpu: GpuSpec | None, on_gpu: bool) -> Result:
    """One decode step of PagedAttention (:func:`utils.kernels.paged_attention.paged_decode`) over a full cache,
    against SDPA on the same keys and values stored contiguously: what reading through block tables costs.

    The cache is filled a block at a time, round-robin over the sequences, as concurrent decoding fills it,
    so each sequence's blocks are scattered through the pool. Bytes are the K and V read once,
    ``2 * seqs * tokens * kv_heads * d * 2``; FLOPs ``4 * seqs * heads * tokens * d``.
    """
    from utils.attention.paged_cache import interleaved_cache
    from utils.kernels.paged_attention import block_tables_tensor, paged_decode

    n_seqs, n_tokens, n_heads, n_kv, d, block = sizes.paged
    dtype = torch.float16 if on_gpu else torch.float32
    dev = device.device()
    k_all, v_all = (torch.randn(n_seqs, n_tokens, n_kv, d, device=dev, dtype=dtype) for _ in range(2))
    cache, seqs = interleaved_cache(k_all, v_all, block)
    tables, lengths = block_tables_tensor(cache, seqs)
    q = torch.randn(n_seqs, n_heads, d, device=dev, dtype=dtype)
    k_contiguous, v_contiguous = (t.transpose(1, 2).contiguous() for t in (k_all, v_all))  # (seqs, kv, tokens, d)
    del k_all, v_all

    def paged():
        return paged_decode(q, cache.k_blocks, cache.v_blocks, tables, lengths)

    def contiguous():
        return F.scaled_dot_product_attention(q[:, :, None], k_contiguous, v_contiguous, enable_gqa=True)[:, :, 0]

    tol = dict(rtol=2e-3, atol=2e-3) if dtype == torch.float16 else dict(rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(paged(), contiguous(), **tol)
    nbytes = 2 * n_seqs * n_tokens * n_kv * d * q.element_size()
    flops = 4 * n_seqs * n_heads * n_tokens * d
    peak = gpu.hbm_bandwidth if gpu else None
    value, fraction = rate_and_fraction(_time(paged, sizes), nbytes, "GB/s", peak)
    baseline, _ = rate_and_fraction(_time(contiguous, sizes), nbytes, "GB/s", peak)
    shape = (f"{n_seqs} seqs x {n_tokens} tok, {n_heads}/{n_kv} heads d{d}, block {block} "
             f"{str(dtype).split('.')[-1]}")
    return Result("paged attention decode", shape, "GB/s", value, "SDPA, contiguous cache", baseline, fraction,
                  "reported only", "n/a", intensity=flops / nbytes)


def _materialises(name: str) -> bool:
    """Whether the row's kernel writes S and P to memory (naive attention, SDPA's MATH backend): unfused intensity."""
    return name.startswith("naive") or name == "SDPA MATH"


def _bandwidth_result(kernel, shape, value, baseline_name, baseline, fraction, on_gpu, intensity) -> Result:
    target = f">= {TARGET_ELEMENTWISE_BANDWIDTH_FRACTION:.0%} of peak HBM"
    verdict = "n/a" if fraction is None or not on_gpu else \
        ("PASS" if fraction >= TARGET_ELEMENTWISE_BANDWIDTH_FRACTION else "MISS")
    return Result(kernel, shape, "GB/s", value, baseline_name, baseline, fraction, target, verdict, intensity)


def cases(on_gpu: bool, quick: bool, gpu: GpuSpec | None) -> list[Result]:
    """FlashAttention at each sequence length (with every SDPA backend and naive attention), then RMSNorm, RoPE,
    the SwiGLU gate, the SFUs' exponential rate and a PagedAttention decode step."""
    sizes = (QUICK if quick else FULL) if on_gpu else CPU_SMOKE
    results = [row for n in sizes.seq_lens for row in bench_flash(sizes, n, gpu, on_gpu)]
    return results + [bench_rms_norm(sizes, gpu, on_gpu), bench_rope(sizes, gpu, on_gpu),
                      bench_swiglu_gate(sizes, gpu, on_gpu), bench_exp2(sizes, gpu, on_gpu),
                      bench_paged_decode(sizes, gpu, on_gpu)]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit code (0 done, 1 a target missed with --strict, 2 no GPU)."""
    return run("benchmarks.attention", __doc__.split("\n")[0], cases, argv)


if __name__ == "__main__":
    sys.exit(main())
