"""Does the tile shape close the gap between our FlashAttention forward and cuDNN's? A sweep.

Run from the repository root on a CUDA GPU (no Jupyter)::

    python -m benchmarks.flash_tiles

For fp16, head_dim 128, batch 4, 16 heads, n = 4096 and 8192, non-causal, it launches
``utils.kernels.flash_attention``'s forward kernel with every ``BLOCK_M`` in (64, 128),
``BLOCK_N`` in (32, 64, 128), 4 or 8 warps and 2 to 4 pipeline stages, checks each
output against SDPA's cuDNN backend, and prints the eight fastest configurations next to
cuDNN and the module's default (64 x 64, 4 warps, 3 stages). Configurations that need
more shared memory than the GPU has are reported and skipped.
"""

from __future__ import annotations

import itertools
import sys

import utils  # noqa: F401
import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.common import header
from utils import device
from utils.bench import time_seconds
from utils.gpu.hardware import spec_for_device
from utils.kernels.flash_attention import _flash_forward_kernel

CONFIGS = list(itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4)))  # BLOCK_M, BLOCK_N, warps, stages
DEFAULT = (64, 64, 4, 3)


def sweep(n: int, batch: int = 4, heads: int = 16, d: int = 128) -> tuple[float, list[tuple[float, tuple]]]:
    """cuDNN's TFLOP/s and ``[(TFLOP/s, config), ...]`` for every config that fits, at sequence length ``n``."""
    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
    flops = 4 * batch * heads * n * n * d
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        reference = F.scaled_dot_product_attention(q, k, v)
        cudnn = flops / time_seconds(lambda: F.scaled_dot_product_attention(q, k, v)) / 1e12
    out, lse = torch.empty_like(q), torch.empty(batch * heads, n, device="cuda")
    rates = []
    for bm, bn, warps, stages in CONFIGS:
        def launch():
            _flash_forward_kernel[(triton.cdiv(n, bm), batch * heads)](
                q, k, v, out, lse, d ** -0.5, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
                heads, n, n, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=False, PRECISION="tf32",
                num_warps=warps, num_stages=stages)
        try:
            launch()
        except triton.runtime.errors.OutOfResources as err:
            print(f"  n={n} {(bm, bn, warps, stages)}: does not fit ({str(err).splitlines()[0][:80]})")
            continue
        torch.testing.assert_close(out, reference, atol=2e-2, rtol=2e-2)
        rates.append((flops / time_seconds(launch) / 1e12, (bm, bn, warps, stages)))
    return cudnn, sorted(rates, reverse=True)


def main() -> int:
    if not (device.HAS_CUDA and not device.INTERPRETER):
        print("benchmarks.flash_tiles needs a CUDA GPU", file=sys.stderr)
        return 2
    for key, value in header(spec_for_device(device.gpu_name())).items():
        print(f"{key:>9}: {value}")
    for n in (4096, 8192):
        cudnn, rates = sweep(n)
        default = next(rate for rate, config in rates if config == DEFAULT)
        print(f"n={n}: SDPA cuDNN {cudnn:.0f} TFLOP/s; default tiles {default:.0f} ({default / cudnn:.0%} of cuDNN)")
        for rate, (bm, bn, warps, stages) in rates[:8]:
            print(f"  {rate:5.0f} TFLOP/s ({rate / cudnn:4.0%} of cuDNN)  BLOCK_M {bm:3d}  BLOCK_N {bn:3d}  "
                  f"{warps} warps  {stages} stages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
