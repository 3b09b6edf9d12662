"""Launch the TMA FlashAttention forward and SDPA's cuDNN attention once each, inside NVTX ranges, for a profiler.

Run under Nsight Compute on a GPU (``benchmarks.gpu_session --steps profile`` does this when ``ncu`` is there)::

    ncu --nvtx --nvtx-include "tma_forward/" --nvtx-include "cudnn_forward/" --section SpeedOfLight \\
        --section WarpStateStats python -m benchmarks.profile_flash

Both run at the shape of the recorded ratio (batch 4, 16 heads, n = 4096, d = 128, fp16, non-causal), each
once before its range so that compilation and autotuning fall outside it. Without ``ncu`` the script still
runs and prints each kernel's time from ``torch.profiler``.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from utils.kernels.flash_attention_hopper import flash_forward

SHAPE = (4, 16, 4096, 128)
CONFIG = (128, 64, 4, 2)  # the sweep's fastest non-causal configuration (benchmarks/README.md)


def main() -> int:
    if not torch.cuda.is_available():
        print("profile_flash: needs a CUDA GPU")
        return 1
    q, k, v = (torch.randn(SHAPE, device="cuda", dtype=torch.float16) for _ in range(3))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)

    runs = {"tma_forward": lambda: flash_forward(q, k, v, False, config=CONFIG)[0], "cudnn_forward": cudnn}
    for name, fn in runs.items():
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for fn in runs.values():
            for _ in range(5):
                fn()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))
    return 0


if __name__ == "__main__":
    sys.exit(main())
