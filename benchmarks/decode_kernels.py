"""Part 5 benchmark: the decode kernels, split-KV paged attention and the int4 / int8 weight-only matmul, on a GPU.

Run from the repository root on a machine with a CUDA GPU, torch and triton (no Jupyter)::

    python -m benchmarks.decode_kernels            # full sizes
    python -m benchmarks.decode_kernels --quick    # the same (already small), fewer matmul batch sizes

Each kernel is checked against its reference first, then timed with :func:`utils.bench.time_seconds`
(``triton.testing.do_bench``: median, L2 flushed between runs). Targets on an H100 SXM (issue 25):

- split-KV paged decode (:func:`utils.kernels.split_kv_decode.split_kv_decode`) for one 32K-token
  sequence (32 query / 8 KV heads of 128, fp16, 16-token blocks scattered through the pool): >= 80 % of
  peak HBM and >= 3x the unsplit kernel (:func:`utils.kernels.paged_attention.paged_decode`, one program
  per query head). Bytes: K and V read once, ``2 * tokens * kv_heads * d * 2``. ``programs_per_sm`` of
  :func:`~utils.kernels.split_kv_decode.choose_num_splits` is swept over 1, 2, 4 and the fastest is shown.
- int4 matmul (:func:`utils.kernels.quant_matmul.quant_matmul`, groups of 128) of an 8192 x 8192 weight at
  batch M = 1, 4, 16: >= 70 % of peak HBM on the weight bytes (packed weight, fp16 scales, uint8 zeros),
  against ``torch.matmul`` with the dequantised fp16 weight (its rate is given on the same int4 bytes, so
  the ratio is the speed-up). ``block_n`` is swept over 16, 32, 64 and the fastest shown. int8 at M = 1 is
  reported only.

Without a GPU the script refuses (exit code 2) unless ``--allow-cpu`` is given, which runs tiny shapes
through Triton's interpreter as a smoke test.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import utils  # noqa: F401  (first: switches Triton to its interpreter when there is no GPU)
import torch

from benchmarks.common import Result, rate_and_fraction, run
from utils import device
from utils.attention.paged_cache import interleaved_cache
from utils.bench import time_seconds
from utils.gpu.hardware import GpuSpec
from utils.kernels.paged_attention import block_tables_tensor, paged_decode
from utils.kernels.quant_matmul import quant_matmul, weight_nbytes
from utils.kernels.split_kv_decode import choose_num_splits, merge_partials, split_kv_decode
from utils.serving.quantisation.quant import dequantize, quantize

TARGET_SPLIT_KV_FRACTION = 0.80
TARGET_SPLIT_KV_VS_UNSPLIT = 3.0
TARGET_QUANT_MATMUL_FRACTION = 0.70
CPU_STAND_IN_SMS = 8


@dataclass(frozen=True)
class Sizes:
    split_kv: tuple[int, int, int, int, int]   # tokens, heads, KV heads, head_dim, block size (one sequence)
    matmul: tuple[int, int, int]               # N, K, group size
    batches: tuple[int, ...]
    programs_per_sm: tuple[int, ...]
    block_ns: tuple[int, ...]
    repeats: int


FULL = Sizes((32768, 32, 8, 128, 16), (8192, 8192, 128), (1, 4, 16), (1, 2, 4), (16, 32, 64), repeats=10)
QUICK = Sizes((32768, 32, 8, 128, 16), (8192, 8192, 128), (1, 16), (2,), (32,), repeats=10)
CPU_SMOKE = Sizes((300, 4, 2, 16, 16), (48, 128, 32), (1, 16), (1,), (16,), repeats=1)


def _time(fn, sizes: Sizes) -> float:
    return time_seconds(fn, warmup=1 if sizes.repeats == 1 else 3, repeats=sizes.repeats)


def _n_sms(gpu: GpuSpec | None, on_gpu: bool) -> int:
    if not on_gpu:
        return CPU_STAND_IN_SMS
    return gpu.sm_count if gpu else torch.cuda.get_device_properties(0).multi_processor_count


def bench_split_kv(sizes: Sizes, gpu: GpuSpec | None, on_gpu: bool) -> Result:
    """One decode step of one long sequence: split-KV against the unsplit paged kernel, in GB/s of K and V."""
    n_tokens, n_heads, n_kv, d, block = sizes.split_kv
    dtype = torch.float16 if on_gpu else torch.float32
    dev = device.device()
    k_all, v_all = (torch.randn(2, n_tokens, n_kv, d, device=dev, dtype=dtype) for _ in range(2))
    cache, seqs = interleaved_cache(k_all, v_all, block)   # two sequences interleaved: scattered blocks
    del k_all, v_all
    seqs = seqs[:1]                                          # decode the first one alone
    tables, lengths = block_tables_tensor(cache, seqs)
    q = torch.randn(1, n_heads, d, device=dev, dtype=dtype)

    def unsplit():
        return paged_decode(q, cache.k_blocks, cache.v_blocks, tables, lengths)

    want = unsplit()
    tol = dict(rtol=2e-3, atol=2e-3) if dtype == torch.float16 else dict(rtol=1e-4, atol=1e-4)
    n_sms = _n_sms(gpu, on_gpu)
    best = None
    for per_sm in sizes.programs_per_sm:
        splits = choose_num_splits(1, n_kv, n_tokens, n_sms, block, programs_per_sm=per_sm)
        out, o_part, lse = split_kv_decode(q, cache.k_blocks, cache.v_blocks, tables, lengths, splits,
                                           return_partials=True)
        torch.testing.assert_close(out, want, **tol)
        torch.testing.assert_close(merge_partials(o_part, lse), want.float(), **tol)
        seconds = _time(lambda: split_kv_decode(q, cache.k_blocks, cache.v_blocks, tables, lengths, splits), sizes)
        if best is None or seconds < best[0]:
            best = (seconds, splits, per_sm)
    seconds, splits, per_sm = best
    nbytes = 2 * n_tokens * n_kv * d * q.element_size()
    peak = gpu.hbm_bandwidth if gpu else None
    value, fraction = rate_and_fraction(seconds, nbytes, "GB/s", peak)
    baseline, _ = rate_and_fraction(_time(unsplit, sizes), nbytes, "GB/s", peak)
    target = (f">= {TARGET_SPLIT_KV_FRACTION:.0%} of peak HBM and >= {TARGET_SPLIT_KV_VS_UNSPLIT:.0f}x "
              "the unsplit kernel")
    verdict = "n/a"
    if on_gpu and fraction is not None:
        verdict = "PASS" if fraction >= TARGET_SPLIT_KV_FRACTION and \
            value >= TARGET_SPLIT_KV_VS_UNSPLIT * baseline else "MISS"
    shape = (f"1 seq x {n_tokens} tok, {n_heads}/{n_kv} heads d{d}, block {block}, {splits} splits "
             f"({per_sm}/SM x {n_sms} SMs) {str(dtype).split('.')[-1]}")
    return Result("split-KV paged decode", shape, "GB/s", value, "paged_decode (unsplit)", baseline, fraction,
                  target, verdict, intensity=4 * n_heads * n_tokens * d / nbytes)


def bench_quant_matmul(sizes: Sizes, m: int, bits: int, gpu: GpuSpec | None, on_gpu: bool) -> Result:
    """``x @ W.T`` for an ``N x K`` weight in int4/int8, batch ``m``: GB/s of the quantised weight's bytes."""
    n, k, group_size = sizes.matmul
    dtype = torch.float16 if on_gpu else torch.float32
    dev = device.device()
    w = torch.randn(n, k, device=dev, dtype=dtype) / k**0.5
    q, scales, zeros = quantize(w, bits, group_size)
    w_hat = dequantize(q, scales, zeros, group_size, bits)
    del w
    x = torch.randn(m, k, device=dev, dtype=dtype)
    want = x.float() @ w_hat.float().T
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.float16 else dict(rtol=1e-4, atol=1e-4)
    best = None
    for block_n in sizes.block_ns:
        torch.testing.assert_close(quant_matmul(x, q, scales, zeros, group_size, bits, block_n).float(), want, **tol)
        seconds = _time(lambda: quant_matmul(x, q, scales, zeros, group_size, bits, block_n), sizes)
        if best is None or seconds < best[0]:
            best = (seconds, block_n)
    seconds, block_n = best
    nbytes = weight_nbytes(n, k, bits, group_size, scale_bytes=scales.element_size())
    peak = gpu.hbm_bandwidth if gpu else None
    value, fraction = rate_and_fraction(seconds, nbytes, "GB/s", peak)
    baseline, _ = rate_and_fraction(_time(lambda: x @ w_hat.T, sizes), nbytes, "GB/s", peak)
    verdict, target = "n/a", "reported only"
    if bits == 4:
        target = f">= {TARGET_QUANT_MATMUL_FRACTION:.0%} of peak HBM (weight bytes)"
        if on_gpu and fraction is not None:
            verdict = "PASS" if fraction >= TARGET_QUANT_MATMUL_FRACTION else "MISS"
    shape = f"M={m}, {n}x{k} int{bits} g{group_size}, block_n {block_n}, x {str(dtype).split('.')[-1]}"
    return Result(f"int{bits} matmul (decode)", shape, "GB/s", value, "torch.matmul, dequantised weight",
                  baseline, fraction, target, verdict, intensity=2 * m * n * k / nbytes)


def cases(on_gpu: bool, quick: bool, gpu: GpuSpec | None) -> list[Result]:
    """Split-KV decode of one long sequence, then the int4 matmul at each batch size and int8 at M = 1."""
    sizes = (QUICK if quick else FULL) if on_gpu else CPU_SMOKE
    rows = [bench_split_kv(sizes, gpu, on_gpu)]
    rows += [bench_quant_matmul(sizes, m, 4, gpu, on_gpu) for m in sizes.batches]
    return rows + [bench_quant_matmul(sizes, 1, 8, gpu, on_gpu)]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit code (0 done, 1 a target missed with --strict, 2 no GPU)."""
    return run("benchmarks.decode_kernels", __doc__.split("\n")[0], cases, argv)


if __name__ == "__main__":
    sys.exit(main())
