"""RoPE two ways on a GPU: stride-2 loads of the even and odd elements, or a contiguous tile split in registers.

Run from the repository root on a CUDA GPU: ``python -m benchmarks.rope_loads``. Prints each version's
GB/s on a 1 GiB fp16 tensor and the global loads and stores in its PTX (recorded output:
``benchmarks/results/rope_loads-h100-sxm.txt``).
"""
import utils  # noqa: F401
import re

import torch
import triton
import triton.language as tl

from benchmarks.common import header
from utils import device
from utils.gpu.hardware import spec_for_device
from utils.bench import time_seconds
from utils.kernels.llama_ops import rope, rope_kernel
from utils.attention.llama import rope_angles

@triton.jit
def strided_rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, n_rows, seq_len, half_dim,
                        BLOCK_ROWS: tl.constexpr, BLOCK_HALF: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (rows < n_rows) & (i < half_dim)
    row_start = rows * 2 * half_dim
    even = tl.load(x_ptr + row_start + 2 * i, mask=mask, other=0.0).to(tl.float32)
    odd = tl.load(x_ptr + row_start + 2 * i + 1, mask=mask, other=0.0).to(tl.float32)
    table = (rows % seq_len) * half_dim + i
    c = tl.load(cos_ptr + table, mask=mask, other=0.0)
    s = tl.load(sin_ptr + table, mask=mask, other=0.0)
    tl.store(y_ptr + row_start + 2 * i, (even * c - odd * s).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_ptr + row_start + 2 * i + 1, (even * s + odd * c).to(y_ptr.dtype.element_ty), mask=mask)

if not (device.HAS_CUDA and not device.INTERPRETER):
    raise SystemExit("benchmarks.rope_loads needs a CUDA GPU")
for key, value in header(spec_for_device(device.gpu_name())).items():
    print(f"{key:>9}: {value}")
shape = (16, 32, 8192, 128)
x = torch.randn(shape, device="cuda", dtype=torch.float16); y = torch.empty_like(x)
cos, sin = (t.cuda() for t in rope_angles(shape[2], shape[3]))
n_rows = x.numel() // 128
def strided(): return strided_rope_kernel[(triton.cdiv(n_rows, 32),)](x, cos, sin, y, n_rows, shape[2], 64, BLOCK_ROWS=32, BLOCK_HALF=64)
k1 = strided(); torch.testing.assert_close(y, rope(x, cos, sin))
for name, fn, kern in (("strided loads", strided, k1), ("tile + split", lambda: rope(x, cos, sin), None)):
    t = time_seconds(fn)
    print(f"{name:14s}: {2 * x.numel() * 2 / t / 1e9:6.0f} GB/s")
def loads(ptx): return sorted(set(re.findall(r"(?:ld|st)\.global(?:\.[a-z0-9]+)*", ptx)))
print("strided PTX:", loads(k1.asm["ptx"]))
for sig, compiled in rope_kernel.device_caches[0][0].items():
    print("tile+split PTX:", loads(compiled.asm["ptx"]))
