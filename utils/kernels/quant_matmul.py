"""Weight-only int4 / int8 matmul for decode, dequantising in registers: ``y = x @ dequantize(q, scales, zeros).T``.

At decode a linear layer multiplies a few activation rows (``M`` = the batch, 1 to 16) by a weight of
``N x K`` parameters: every weight is read once and used ``M`` times, so the step is bound by the bytes
of the weight. Storing it in 4 bits with a 16-bit scale and an 8-bit zero point per group of 128
(:mod:`utils.serving.quantisation.quant`) cuts those bytes from 2 per weight to ``0.5 + 3/128``. The kernel must
never write the dequantised weight back to memory: each program loads packed bytes, turns them into
fp16/fp32 values in registers (``w = (q - z) * s``), and feeds them straight to ``tl.dot``.

Layout (the one :func:`utils.serving.quantisation.quant.quantize` writes, ``nn.Linear``'s ``(out, in)``):
``x``: ``(M, K)``; ``q``: ``(N, K)`` uint8 for int8, ``(N, K // 2)`` uint8 for int4 with column ``2j`` in
the low nibble of byte ``j`` and column ``2j + 1`` in the high nibble; ``scales``: ``(N, K // group_size)``;
``zeros``: the same shape, uint8. Result ``(M, N)`` in ``x``'s dtype.

Program ``(n, m)`` computes a ``BLOCK_M x BLOCK_N`` tile of ``y``, walking ``K`` in steps of ``BLOCK_K``
columns that lie inside one quantisation group (``BLOCK_K`` divides ``group_size``), so one scale and
one zero point per output row serve the whole step. For int4 the low nibbles hold the even columns
and the high nibbles the odd ones, so the step is two dots: ``x[:, even] @ w_lo.T + x[:, odd] @ w_hi.T``
(no interleaving needed). The structure follows Triton's matmul tutorial and the int4 decode
kernels of gpt-fast and of Triton-based AWQ/GPTQ ports; the quantisation is round-to-nearest.
"""

from __future__ import annotations

import torch

from utils.device import check_tensors
from utils.kernels.triton_or_stand_in import tl, triton
from utils.serving.quantisation.quant import bytes_per_weight, check_bits_group

DEFAULT_BLOCK_N = 64
MAX_BLOCK_K = 128


@triton.jit
def _quant_matmul_kernel(X, Q, S, Z, Y, M, N, K, s_xm, s_xk, s_qn, s_qk, s_sn, s_sg, s_ym, s_yn,
                         GROUP_SIZE: tl.constexpr, BITS: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP32: tl.constexpr):
    """Program (n, m): y[m-tile, n-tile] = x[m-tile] @ ((q - z) * s)[n-tile].T, the weight dequantised in registers."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if BITS == 4:
        offs_b = tl.arange(0, BLOCK_K // 2)                              # byte j of the step: columns 2j and 2j + 1
        for k0 in range(0, K, BLOCK_K):
            group = k0 // GROUP_SIZE
            s = tl.load(S + offs_n * s_sn + group * s_sg, mask=mask_n, other=0.0).to(tl.float32)
            z = tl.load(Z + offs_n * s_sn + group * s_sg, mask=mask_n, other=0).to(tl.float32)
            packed = tl.load(Q + offs_n[:, None] * s_qn + (k0 // 2 + offs_b)[None, :] * s_qk,
                             mask=mask_n[:, None], other=0)
            w_lo = ((packed & 0xF).to(tl.float32) - z[:, None]) * s[:, None]   # (BLOCK_N, BLOCK_K / 2): even columns
            w_hi = ((packed >> 4).to(tl.float32) - z[:, None]) * s[:, None]    # odd columns
            x_even = tl.load(X + offs_m[:, None] * s_xm + (k0 + 2 * offs_b)[None, :] * s_xk,
                             mask=mask_m[:, None], other=0.0)
            x_odd = tl.load(X + offs_m[:, None] * s_xm + (k0 + 2 * offs_b + 1)[None, :] * s_xk,
                            mask=mask_m[:, None], other=0.0)
            if FP32:
                acc += tl.dot(x_even, tl.trans(w_lo), input_precision="ieee")
                acc += tl.dot(x_odd, tl.trans(w_hi), input_precision="ieee")
            else:
                acc += tl.dot(x_even, tl.trans(w_lo.to(x_even.dtype)))
                acc += tl.dot(x_odd, tl.trans(w_hi.to(x_odd.dtype)))
    else:
        offs_k = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            group = k0 // GROUP_SIZE
            s = tl.load(S + offs_n * s_sn + group * s_sg, mask=mask_n, other=0.0).to(tl.float32)
            z = tl.load(Z + offs_n * s_sn + group * s_sg, mask=mask_n, other=0).to(tl.float32)
            levels = tl.load(Q + offs_n[:, None] * s_qn + (k0 + offs_k)[None, :] * s_qk, mask=mask_n[:, None], other=0)
            w = (levels.to(tl.float32) - z[:, None]) * s[:, None]
            x = tl.load(X + offs_m[:, None] * s_xm + (k0 + offs_k)[None, :] * s_xk, mask=mask_m[:, None], other=0.0)
            if FP32:
                acc += tl.dot(x, tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w.to(x.dtype)))
    tl.store(Y + offs_m[:, None] * s_ym + offs_n[None, :] * s_yn, acc.to(Y.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


def kernel_block_k(bits: int, group_size: int) -> int:
    """The columns per step: ``min(group_size, 128)``; ``group_size`` must be a power of two, >= 32 for int4
    (16 packed bytes: ``tl.dot`` needs 16 or more along each side) and >= 16 for int8."""
    check_bits_group(bits, group_size)
    low = 32 if bits == 4 else 16
    if group_size < low or group_size & (group_size - 1):
        raise ValueError(f"this kernel needs group_size a power of two >= {low} for int{bits}, got {group_size}")
    return min(group_size, MAX_BLOCK_K)


def quant_matmul(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                 bits: int, block_n: int = DEFAULT_BLOCK_N) -> torch.Tensor:
    """``x @ dequantize(q, scales, zeros, group_size, bits).T`` without materialising the weight (module docstring).

    ``x``: ``(M, K)`` fp16 or fp32 (bf16 on a GPU); ``q``, ``scales``, ``zeros`` from
    :func:`utils.serving.quantisation.quant.quantize` of an ``(N, K)`` weight. Returns ``(M, N)`` in ``x``'s dtype.
    """
    block_k = kernel_block_k(bits, group_size)
    check_tensors(x, q, scales, zeros)
    if x.dim() != 2 or q.dim() != 2 or q.dtype != torch.uint8 or zeros.dtype != torch.uint8:
        raise ValueError(f"x must be (M, K) and q, zeros uint8 from utils.serving.quantisation.quant.quantize; got x "
                         f"{tuple(x.shape)}, q {q.dtype} {tuple(q.shape)}, zeros {zeros.dtype}")
    m, k = x.shape
    n = q.shape[0]
    packed_k = k // 2 if bits == 4 else k
    if k % group_size or q.shape[1] != packed_k or scales.shape != (n, k // group_size) or zeros.shape != scales.shape:
        raise ValueError(f"for x of shape ({m}, {k}) and int{bits} in groups of {group_size}, q must be ({n}, "
                         f"{packed_k}) and scales, zeros ({n}, {k // group_size}); got q {tuple(q.shape)}, scales "
                         f"{tuple(scales.shape)}, zeros {tuple(zeros.shape)}")
    if not x.is_floating_point() or not scales.is_floating_point():
        raise ValueError(f"x and scales must be floating point, got {x.dtype} and {scales.dtype}")
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    scales, zeros = scales.contiguous(), zeros.contiguous()
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m = 16 if m <= 16 else 32
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m))
    _quant_matmul_kernel[grid](x, q, scales, zeros, y, m, n, k, x.stride(0), x.stride(1), q.stride(0), q.stride(1),
                               scales.stride(0), scales.stride(1), y.stride(0), y.stride(1),
                               GROUP_SIZE=group_size, BITS=bits, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                               FP32=x.dtype == torch.float32)
    return y


def weight_nbytes(n: int, k: int, bits: int, group_size: int, scale_bytes: int = 2) -> int:
    """Bytes the kernel must read for an ``n x k`` weight: ``n k bits / 8`` plus a scale and a uint8 zero per group."""
    check_bits_group(bits, group_size, k)
    return round(n * k * bytes_per_weight(bits, group_size, scale_bytes, zero_bytes=1))
