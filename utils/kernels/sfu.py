"""A kernel that does nothing but exponentials: the throughput of the SM's special function units.

Softmax, and so attention, needs one exponential per score. On NVIDIA GPUs ``exp2``
runs on the special function units (SFUs; SASS ``MUFU.EX2``), not on the FMA pipes or
the Tensor Cores. The CUDA C++ Programming Guide's table of arithmetic instruction
throughput gives 16 results per clock per SM for ``exp2f`` (and reciprocal, log2,
sine, cosine) on compute capability 9.0, so an H100 SXM at 1.98 GHz can do at most
``132 * 16 * 1.98e9 = 4.2e12`` exponentials per second (:data:`SFU_OPS_PER_CLOCK_PER_SM`); the
FlashAttention-3 paper (Shah et al. 2024, arXiv:2407.08608, section 3.1) quotes
3.9 TFLOPS "of special functions" against 989 TFLOPS of fp16 matmul.

:func:`exp2_chain` applies ``v <- exp2(-v)`` ``iters`` times to every element and sums
the values, a dependent chain per element that stays in registers: it reads and writes
``8 n`` bytes and issues ``n * iters`` exponentials (and as many FADDs, which the FMA
pipes absorb), so for large ``iters`` it is bound by the SFUs alone. The chain
converges to the fixed point of ``v = 2^-v`` (0.6412), so it never overflows.
"""

from __future__ import annotations

import torch

from utils.kernels.triton_or_stand_in import tl, triton
from utils.device import check_tensors
from utils.validate import check_positive_int

SFU_OPS_PER_CLOCK_PER_SM = 16
"""exp2f results per clock per SM, compute capability 5.x to 9.0 (CUDA C++ Programming Guide, throughput table)."""


@triton.jit
def exp2_chain_kernel(x_ptr, out_ptr, n_elements, ITERS: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """``out[i] = sum_k v_k`` with ``v_0 = x[i]``, ``v_k = exp2(-v_{k-1})``, for ``k = 1 .. ITERS``."""
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    v = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    acc = tl.zeros([BLOCK_SIZE], tl.float32)
    for _ in range(ITERS):
        v = tl.math.exp2(-v)
        acc += v
    tl.store(out_ptr + offsets, acc, mask=mask)


def exp2_chain(x: torch.Tensor, iters: int, block_size: int = 1024) -> torch.Tensor:
    """Run :func:`exp2_chain_kernel` over a contiguous fp32 tensor; ``x.numel() * iters`` exponentials."""
    check_tensors(x)
    check_positive_int("iters", iters)
    if x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError(f"x must be a contiguous float32 tensor, got {x.dtype} (contiguous: {x.is_contiguous()})")
    out = torch.empty_like(x)
    if x.numel():
        exp2_chain_kernel[(triton.cdiv(x.numel(), block_size),)](x, out, x.numel(), ITERS=iters, BLOCK_SIZE=block_size)
    return out


def exp2_chain_reference(x: torch.Tensor, iters: int) -> torch.Tensor:
    """The same chain in PyTorch, for checking."""
    v, acc = x.float(), torch.zeros_like(x, dtype=torch.float32)
    for _ in range(iters):
        v = torch.exp2(-v)
        acc += v
    return acc
