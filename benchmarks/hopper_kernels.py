"""The kernels at Hopper's limit: persistent TMA matmul (fp16, fp8), FlashAttention forward with TMA, fused backward.

Run from the repository root on a CUDA GPU of compute capability 9.0 (no Jupyter)::

    python -m benchmarks.hopper_kernels            # the harness rows below, one table
    python -m benchmarks.hopper_kernels --sweep    # also sweep tiles, warps and stages of each kernel first

Each kernel is checked against its reference before it is timed (``utils.bench.time_seconds``:
``triton.testing.do_bench``, median, L2 flushed between runs). Targets on an H100 SXM (issue 26):

- persistent TMA matmul (:func:`utils.kernels.matmul_persistent.matmul_persistent`), fp16 4096^3:
  >= 0.95x ``torch.matmul`` (cuBLAS);
- fp8 e4m3 matmul (:func:`utils.kernels.matmul_persistent.matmul_fp8`), 4096^3 with per-tensor scales,
  bf16 out: >= 0.9x ``torch._scaled_mm`` (timed with and without ``use_fast_accum``; the target is
  against the default, and both are printed);
- FlashAttention forward with TMA (:func:`utils.kernels.flash_attention_hopper.flash_forward`), fp16,
  d = 128, batch 4, 16 heads, n = 4096 and 8192, non-causal and causal: >= 0.85x SDPA's cuDNN backend
  (stretch 1.0x) and >= 1.3x SDPA's FlashAttention-2 backend;
- FlashAttention backward (:mod:`utils.kernels.flash_attention_backward`), same shapes: >= 1.0x SDPA's
  FlashAttention-2 backward, both timed through autograd (``torch.autograd.grad`` of the forward's output).

FLOPs: ``2 m n k`` for a matmul; ``4 b h n^2 d`` for the attention forward and ``10 b h n^2 d`` for its
backward (five n x n x d matmuls), halved when causal (the convention of the FlashAttention papers and of
Triton's tutorial). The fp8 row's fraction is of the fp8 peak; the others' of the fp16 peak.

Without a GPU, ``--allow-cpu`` runs tiny shapes through Triton's interpreter (no fp8, no SDPA backends):
a smoke test of the code paths, not of speed.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import utils  # noqa: F401  (first: switches Triton to its interpreter when there is no GPU)
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.common import Result, rate_and_fraction, run
from utils import device
from utils.bench import matmul_flops, time_seconds
from utils.gpu.hardware import GpuSpec

TARGET_MATMUL_VS_CUBLAS = 0.95
TARGET_FP8_VS_SCALED_MM = 0.90
TARGET_FLASH_VS_CUDNN = 0.85
TARGET_FLASH_VS_FA2 = 1.3
TARGET_BACKWARD_VS_FA2 = 1.0


@dataclass(frozen=True)
class Sizes:
    matmul_mnk: int
    batch: int
    heads: int
    seq_lens: tuple[int, ...]
    head_dim: int


FULL = Sizes(4096, 4, 16, (4096, 8192), 128)
QUICK = Sizes(2048, 2, 16, (4096,), 128)
CPU_SMOKE = Sizes(64, 1, 2, (128,), 32)


def _time(fn) -> float:
    return time_seconds(fn, warmup=1, repeats=1) if not device.HAS_CUDA else time_seconds(fn)


def _verdict(on_gpu: bool, ok: bool) -> str:
    return ("PASS" if ok else "MISS") if on_gpu else "n/a"


def bench_matmul_persistent(sizes: Sizes, gpu: GpuSpec | None, on_gpu: bool) -> Result:
    """fp16 ``n^3`` by the persistent TMA kernel against ``torch.matmul`` on the same row-major operands."""
    from utils.kernels.matmul_persistent import DEFAULT_CONFIG, matmul_persistent

    n = sizes.matmul_mnk
    dtype = torch.float16 if on_gpu else torch.float32
    a, b = (torch.randn(n, n, device=device.device()).to(dtype) for _ in range(2))
    torch.testing.assert_close(matmul_persistent(a, b).float(), a.float() @ b.float(), atol=1e-1, rtol=1e-2)
    flops, peak = matmul_flops(n, n, n), (gpu.flops("fp16") if gpu else None)
    value, fraction = rate_and_fraction(_time(lambda: matmul_persistent(a, b)), flops, "TFLOP/s", peak)
    baseline, _ = rate_and_fraction(_time(lambda: torch.matmul(a, b)), flops, "TFLOP/s", peak)
    c = DEFAULT_CONFIG
    shape = (f"{n}^3 {str(dtype).split('.')[-1]}, {c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']}, "
             f"{c['num_warps']} warps, {c['num_stages']} stages")
    return Result("persistent TMA matmul", shape, "TFLOP/s", value, "torch.matmul", baseline, fraction,
                  f">= {TARGET_MATMUL_VS_CUBLAS:.2f}x torch.matmul",
                  _verdict(on_gpu, value >= TARGET_MATMUL_VS_CUBLAS * baseline), intensity=flops / (3 * n * n * 2))


def _fp8_operands(n: int) -> tuple[torch.Tensor, ...]:
    """fp8 e4m3 ``a`` (row-major) and ``b`` (column-major) with per-tensor scales, from N(0, 1) data."""
    a32, w32 = (torch.randn(n, n, device="cuda") for _ in range(2))
    scale_a, scale_b = (t.abs().max() / 448.0 for t in (a32, w32))  # 448: the largest finite e4m3 value
    a = (a32 / scale_a).to(torch.float8_e4m3fn)
    b = (w32 / scale_b).to(torch.float8_e4m3fn).T  # (K, N) column-major
    return a, b, scale_a.float().reshape(()), scale_b.float().reshape(())


def bench_matmul_fp8(sizes: Sizes, gpu: GpuSpec | None) -> list[Result]:
    """fp8 e4m3 ``n^3`` with per-tensor scales, bf16 out, against ``torch._scaled_mm`` (default and fast accumulation)."""
    from utils.kernels.matmul_persistent import DEFAULT_FP8_CONFIG, matmul_fp8

    n = sizes.matmul_mnk
    a, b, sa, sb = _fp8_operands(n)
    ours = matmul_fp8(a, b, sa, sb)
    reference = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    exact = (a.float() @ b.float()) * sa * sb
    assert (ours.float() - exact).norm() / exact.norm() < 1e-2, "fp8 matmul does not match its fp32 reference"
    assert (reference.float() - exact).norm() / exact.norm() < 1e-2
    flops, peak = matmul_flops(n, n, n), (gpu.flops("fp8") if gpu else None)
    value, fraction = rate_and_fraction(_time(lambda: matmul_fp8(a, b, sa, sb)), flops, "TFLOP/s", peak)
    rows = []
    for fast in (False, True):
        base, _ = rate_and_fraction(_time(lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb,
                                                                   out_dtype=torch.bfloat16, use_fast_accum=fast)),
                                    flops, "TFLOP/s", peak)
        c = DEFAULT_FP8_CONFIG
        shape = f"{n}^3 e4m3 -> bf16, {c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']}"
        rows.append(Result("fp8 matmul", shape, "TFLOP/s", value,
                           f"torch._scaled_mm{' (use_fast_accum)' if fast else ''}", base, fraction,
                           f">= {TARGET_FP8_VS_SCALED_MM:.1f}x torch._scaled_mm" if not fast else "reported only",
                           _verdict(True, value >= TARGET_FP8_VS_SCALED_MM * base) if not fast else "n/a",
                           intensity=flops / (2 * n * n + 2 * n * n)))
    return rows


def _sdpa(backend: str, q, k, v, causal: bool):
    with sdpa_kernel(getattr(SDPBackend, backend)):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _attention_inputs(sizes: Sizes, n: int, on_gpu: bool):
    dtype = torch.float16 if on_gpu else torch.float32
    return [torch.randn(sizes.batch, sizes.heads, n, sizes.head_dim, device=device.device(), dtype=dtype,
                        requires_grad=True) for _ in range(3)]


def bench_flash_forward(sizes: Sizes, n: int, causal: bool, gpu: GpuSpec | None, on_gpu: bool) -> list[Result]:
    """The TMA forward (autotuned over its tuned configurations) against SDPA's cuDNN and FlashAttention-2."""
    from utils.attention.flash_reference import attention_reference
    from utils.gpu.roofline import attention_intensity
    from utils.kernels.flash_attention_hopper import flash_forward

    q, k, v = (t.detach() for t in _attention_inputs(sizes, n, on_gpu))
    out, _ = flash_forward(q, k, v, causal)
    tol = dict(rtol=2e-2, atol=2e-2) if on_gpu else dict(rtol=2e-4, atol=2e-4)
    torch.testing.assert_close(out.float(), attention_reference(q.float(), k.float(), v.float(), causal), **tol)
    flops = 4 * sizes.batch * sizes.heads * n * n * sizes.head_dim // (2 if causal else 1)
    peak = gpu.flops("fp16") if gpu else None
    value, fraction = rate_and_fraction(_time(lambda: flash_forward(q, k, v, causal)), flops, "TFLOP/s", peak)
    shape = (f"b{sizes.batch} h{sizes.heads} n{n} d{sizes.head_dim} {str(q.dtype).split('.')[-1]}"
             f"{' causal' if causal else ''}")
    intensity = attention_intensity(n, sizes.head_dim, q.element_size(), fused=True)
    rows = []
    for backend, factor in (("CUDNN_ATTENTION", TARGET_FLASH_VS_CUDNN), ("FLASH_ATTENTION", TARGET_FLASH_VS_FA2)):
        if not on_gpu:
            continue
        base, _ = rate_and_fraction(_time(lambda b=backend: _sdpa(b, q, k, v, causal)), flops, "TFLOP/s", peak)
        rows.append(Result("flash_attention_hopper fwd", shape, "TFLOP/s", value, f"SDPA {backend}", base, fraction,
                           f">= {factor}x SDPA {backend}", _verdict(on_gpu, value >= factor * base),
                           intensity=intensity))
    if not rows:
        rows.append(Result("flash_attention_hopper fwd", shape, "TFLOP/s", value, "none on a CPU", value, fraction,
                           "reported only", "n/a", intensity=intensity))
    return rows


def bench_flash_backward(sizes: Sizes, n: int, causal: bool, gpu: GpuSpec | None, on_gpu: bool) -> Result:
    """dQ, dK, dV through autograd: the Hopper forward's fused backward against SDPA FlashAttention-2's."""
    from utils.attention.flash_reference import attention_reference
    from utils.kernels.flash_attention_hopper import flash_attention_hopper

    q, k, v = _attention_inputs(sizes, n, on_gpu)
    d_out = torch.randn_like(q)
    out = flash_attention_hopper(q, k, v, causal)
    grads = torch.autograd.grad(out, (q, k, v), d_out, retain_graph=True)
    if on_gpu:
        reference = _sdpa("FLASH_ATTENTION", q, k, v, causal)
        expected = torch.autograd.grad(reference, (q, k, v), d_out, retain_graph=True)
        tol = dict(rtol=5e-2, atol=5e-2)
    else:
        reference = attention_reference(q, k, v, causal)
        expected = torch.autograd.grad(reference, (q, k, v), d_out, retain_graph=True)
        tol = dict(rtol=2e-4, atol=2e-4)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got.float(), want.float(), **tol)
    flops = 10 * sizes.batch * sizes.heads * n * n * sizes.head_dim // (2 if causal else 1)
    peak = gpu.flops("fp16") if gpu else None
    value, fraction = rate_and_fraction(
        _time(lambda: torch.autograd.grad(out, (q, k, v), d_out, retain_graph=True)), flops, "TFLOP/s", peak)
    base = value
    if on_gpu:
        base, _ = rate_and_fraction(
            _time(lambda: torch.autograd.grad(reference, (q, k, v), d_out, retain_graph=True)), flops, "TFLOP/s",
            peak)
    shape = (f"b{sizes.batch} h{sizes.heads} n{n} d{sizes.head_dim} {str(q.dtype).split('.')[-1]}"
             f"{' causal' if causal else ''}")
    return Result("flash_attention bwd (fused)", shape, "TFLOP/s", value,
                  "SDPA FLASH_ATTENTION bwd" if on_gpu else "none on a CPU", base, fraction,
                  f">= {TARGET_BACKWARD_VS_FA2}x SDPA FLASH_ATTENTION bwd" if on_gpu else "reported only",
                  _verdict(on_gpu, value >= TARGET_BACKWARD_VS_FA2 * base))


def cases(on_gpu: bool, quick: bool, gpu: GpuSpec | None) -> list[Result]:
    """The persistent matmul (fp16, then fp8 on a GPU), the TMA forward and the fused backward at each length."""
    sizes = (QUICK if quick else FULL) if on_gpu else CPU_SMOKE
    rows = [bench_matmul_persistent(sizes, gpu, on_gpu)]
    if on_gpu and torch.cuda.get_device_capability()[0] >= 9:
        rows += bench_matmul_fp8(sizes, gpu)
    for causal in (False, True):
        for n in sizes.seq_lens:
            rows += bench_flash_forward(sizes, n, causal, gpu, on_gpu)
    for causal in (False, True):
        for n in sizes.seq_lens:
            rows.append(bench_flash_backward(sizes, n, causal, gpu, on_gpu))
    return rows


# --- The sweeps: which tiles, warps and stages are fastest on this GPU --------------------------------------


def _rate(fn, flops: float) -> float:
    import triton.testing

    return flops / (triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e-3) / 1e12


def sweep_matmul(n: int = 4096) -> list[str]:
    """TFLOP/s of every :data:`SWEEP_CONFIGS` entry, fp16 and fp8, next to cuBLAS and ``_scaled_mm``."""
    from utils.kernels.matmul_persistent import SWEEP_CONFIGS, matmul_fp8, matmul_persistent

    lines, flops = [], matmul_flops(n, n, n)
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.float16) for _ in range(2))
    b_k_major = b.T.contiguous().T  # the same B stored (N, K): the kernel reads it K-major
    lines.append(f"fp16 {n}^3: torch.matmul {_rate(lambda: torch.matmul(a, b), flops):.0f} TFLOP/s")
    print(lines[-1], flush=True)
    fa, fb, sa, sb = _fp8_operands(n)
    for fast in (False, True):
        rate = _rate(lambda: torch._scaled_mm(fa, fb, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                              use_fast_accum=fast), flops)
        lines.append(f"fp8 {n}^3: torch._scaled_mm (use_fast_accum={fast}) {rate:.0f} TFLOP/s")
        print(lines[-1], flush=True)
    for cfg in SWEEP_CONFIGS:
        fp8_cfg = dict(cfg, BLOCK_K=cfg["BLOCK_K"] * 2)
        variants = [("fp16", lambda cfg=cfg: matmul_persistent(a, b, cfg)),
                    ("fp8", lambda fp8_cfg=fp8_cfg: matmul_fp8(fa, fb, sa, sb, config=fp8_cfg))]
        if cfg == SWEEP_CONFIGS[0]:
            variants.append(("fp16 B K-major", lambda cfg=cfg: matmul_persistent(a, b_k_major, cfg)))
        for label, fn in variants:
            try:
                fn()
                rate = f"{_rate(fn, flops):6.0f} TFLOP/s"
            except Exception as err:  # noqa: BLE001  (out of shared memory and the like: report and go on)
                rate = f"failed: {str(err).splitlines()[0][:90]}"
            lines.append(f"  {label:14s} {cfg if label != 'fp8' else fp8_cfg}: {rate}")
            print(lines[-1], flush=True)
    return lines


def sweep_flash(n: int = 4096, batch: int = 4, heads: int = 16, d: int = 128) -> list[str]:
    """TFLOP/s of the TMA forward for every sweep configuration (non-causal; the four fastest again causal),
    then of every backward configuration, next to SDPA's cuDNN and FlashAttention-2 backends."""
    from utils.kernels.flash_attention_backward import BACKWARD_CONFIGS, flash_attention_backward
    from utils.kernels.flash_attention_hopper import SWEEP_CONFIGS, flash_forward

    lines: list[str] = []

    def say(text: str) -> None:
        lines.append(text)
        print(text, flush=True)

    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
    fastest: list[tuple[float, tuple]] = []
    for causal in (False, True):
        flops = 4 * batch * heads * n * n * d / (2 if causal else 1)
        ref = {b: _rate(lambda b=b: _sdpa(b, q, k, v, causal), flops) for b in ("CUDNN_ATTENTION", "FLASH_ATTENTION")}
        say(f"fwd n={n} causal={causal}: SDPA cuDNN {ref['CUDNN_ATTENTION']:.0f}, FA-2 {ref['FLASH_ATTENTION']:.0f} "
            "TFLOP/s")
        expected = _sdpa("CUDNN_ATTENTION", q, k, v, causal)
        configs = SWEEP_CONFIGS if not causal else [c for _, c in sorted(fastest, reverse=True)[:4]]
        for cfg in configs:
            try:
                out, _ = flash_forward(q, k, v, causal, config=cfg)
                torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
                rate = _rate(lambda cfg=cfg: flash_forward(q, k, v, causal, config=cfg), flops)
                fastest.append((rate, cfg))
                text = f"{rate:5.0f} TFLOP/s ({rate / ref['CUDNN_ATTENTION']:.2f}x cuDNN, " \
                       f"{rate / ref['FLASH_ATTENTION']:.2f}x FA-2)"
            except Exception as err:  # noqa: BLE001  (out of shared memory and the like: report and go on)
                text = f"failed: {str(err).splitlines()[0][:90]}"
            say(f"  fwd {cfg} (BLOCK_M, BLOCK_N, warps, stages): {text}")
    d_out = torch.randn_like(q)
    for causal in (False, True):
        flops = 10 * batch * heads * n * n * d / (2 if causal else 1)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        ref_out = _sdpa("FLASH_ATTENTION", qg, kg, vg, causal)
        fa2 = _rate(lambda: torch.autograd.grad(ref_out, (qg, kg, vg), d_out, retain_graph=True), flops)
        say(f"bwd n={n} causal={causal}: SDPA FA-2 backward {fa2:.0f} TFLOP/s")
        out, lse = flash_forward(q, k, v, causal)
        for m1, n1, m2, n2, warps, stages in BACKWARD_CONFIGS:
            def fn(m1=m1, n1=n1, m2=m2, n2=n2, warps=warps, stages=stages):
                return flash_attention_backward(q, k, v, out, lse, d_out, causal, d ** -0.5, block_m1=m1,
                                                block_n1=n1, block_m2=m2, block_n2=n2, num_warps=warps,
                                                num_stages=stages)
            try:
                fn()
                rate = _rate(fn, flops)
                text = f"{rate:5.0f} TFLOP/s ({rate / fa2:.2f}x FA-2)"
            except Exception as err:  # noqa: BLE001
                text = f"failed: {str(err).splitlines()[0][:90]}"
            say(f"  bwd {(m1, n1, m2, n2, warps, stages)} (M1, N1, M2, N2, warps, stages): {text}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """``--sweep [FILE]``: the sweeps first (written to FILE), then the harness rows; else the rows alone.
    ``--sweep-only``: the sweeps and nothing else."""
    argv = list(sys.argv[1:] if argv is None else argv)
    sweep_only = "--sweep-only" in argv
    if sweep_only:
        argv[argv.index("--sweep-only")] = "--sweep"
    if "--sweep" in argv:
        i = argv.index("--sweep")
        path = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else None
        del argv[i:i + (2 if path else 1)]
        if not (device.HAS_CUDA and not device.INTERPRETER):
            print("--sweep needs a CUDA GPU", file=sys.stderr)
            return 2
        from benchmarks.common import header
        from utils.gpu.hardware import spec_for_device

        start = time.time()
        lines = [f"{k:>9}: {v}" for k, v in header(spec_for_device(device.gpu_name())).items()]
        lines += sweep_matmul() + sweep_flash()
        lines.append(f"sweep took {time.time() - start:.0f} s")
        if path:
            with open(path, "w") as f:
                f.write("\n".join(lines) + "\n")
        if sweep_only:
            return 0
    return run("benchmarks.hopper_kernels", __doc__.split("\n")[0], cases, argv)


if __name__ == "__main__":
    sys.exit(main())
