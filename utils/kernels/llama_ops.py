"""RMSNorm, RoPE and SwiGLU in Triton: the memory-bound element-wise kernels of a LLaMA block.

Each reads its input once and writes its output once, so its speed is HBM
bandwidth; the references they are checked against are in
:mod:`utils.attention.llama`.

- RMSNorm (Zhang & Sennrich 2019): one program per row,
  ``y = x * r * w`` with ``r = 1 / sqrt(mean(x^2) + eps)``, saving ``r`` per
  row for the backward. With ``g = dy * w``, the backward is
  ``dx = r * g - x * r^3 * mean(g * x)`` and ``dw = sum over rows of dy * x * r``;
  each backward program accumulates ``dw`` over its rows in registers and
  writes one partial row, summed afterwards.
- RoPE (Su et al. 2021): rotate the pairs of every row of
  ``(..., seq, head_dim)`` by ``m * theta_i``, from ``cos`` and ``sin`` tables of
  shape ``(seq, head_dim / 2)``; the pairs are adjacent ``(x_{2i}, x_{2i+1})``
  (``layout="interleaved"``, Meta's) or halves ``(x_i, x_{i+d/2})``
  (``layout="neox"``, Hugging Face's): :mod:`utils.attention.rope`.
- SwiGLU's gate (Shazeer 2020): ``SiLU(a) * b = a * sigmoid(a) * b`` in one pass.
"""

from __future__ import annotations

import torch

from utils.attention.rope import check_layout
from utils.kernels.triton_or_stand_in import tl, triton
from utils.device import check_tensors
from utils.validate import check_positive

MAX_ROW = 2**16
"""Longest row the one-program-per-row kernels take (the whole row lives in registers)."""


def _check_rows(x: torch.Tensor, name: str = "x") -> None:
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"{name} must have at least one dimension with a non-empty last one, got {tuple(x.shape)}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous (one program reads one row of consecutive elements)")
    if x.shape[-1] > MAX_ROW:
        raise ValueError(f"rows may have at most {MAX_ROW} elements, got {x.shape[-1]}")


@triton.jit
def rms_norm_forward_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, n_cols, eps, BLOCK_SIZE: tl.constexpr):
    """Program ``row``: ``y = x * r * w`` for one row, and ``r = 1 / sqrt(mean(x^2) + eps)``."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(y_ptr + row * n_cols + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def rms_norm_backward_kernel(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, n_rows, n_cols,
                             BLOCK_SIZE: tl.constexpr):
    """Program ``p`` handles rows ``p, p + P, ...``: writes their ``dx`` and one partial ``dw`` row."""
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_SIZE], tl.float32)
    for row in range(pid, n_rows, n_programs):
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        g = dy * w
        dx = rstd * g - x * (rstd * rstd * rstd) * (tl.sum(g * x, axis=0) / n_cols)
        tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * x * rstd
    tl.store(dw_partial_ptr + pid * n_cols + cols, dw, mask=mask)


class RMSNorm(torch.autograd.Function):
    """RMSNorm over the last dimension by the Triton kernels, differentiable in ``x`` and ``weight``."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rows = x.reshape(-1, x.shape[-1])
        y = torch.empty_like(rows)
        rstd = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
        block = triton.next_power_of_2(rows.shape[1])
        if rows.shape[0]:
            rms_norm_forward_kernel[(rows.shape[0],)](rows, weight, y, rstd, rows.shape[1], eps, BLOCK_SIZE=block)
        ctx.save_for_backward(rows, weight, rstd)
        ctx.x_shape = x.shape
        return y.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        rows, weight, rstd = ctx.saved_tensors
        n_rows, n_cols = rows.shape
        dy = dy.reshape(n_rows, n_cols).contiguous()
        dx = torch.empty_like(rows)
        n_programs = max(1, min(n_rows, 64))
        dw_partial = torch.zeros((n_programs, n_cols), dtype=torch.float32, device=rows.device)
        if n_rows:
            rms_norm_backward_kernel[(n_programs,)](rows, weight, dy, rstd, dx, dw_partial, n_rows, n_cols,
                                                    BLOCK_SIZE=triton.next_power_of_2(n_cols))
        return dx.view(ctx.x_shape), dw_partial.sum(0).to(weight.dtype), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm of every row of ``x`` (last dimension), scaled by ``weight``; differentiable.

    ``x`` is contiguous, of any shape ``(..., n)``; ``weight`` has shape ``(n,)`` and ``x``'s dtype.
    Computes in fp32 and returns ``x``'s dtype, like :func:`utils.attention.llama.rms_norm`.
    """
    check_tensors(x, weight)
    _check_rows(x)
    if weight.shape != (x.shape[-1],) or weight.dtype != x.dtype:
        raise ValueError(f"weight must have shape ({x.shape[-1]},) and dtype {x.dtype}, "
                         f"got {tuple(weight.shape)} and {weight.dtype}")
    check_positive("eps", eps)
    return RMSNorm.apply(x, weight.contiguous(), float(eps)).view_as(x)


@triton.jit
def rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, n_rows, seq_len, half_dim,
                BLOCK_ROWS: tl.constexpr, BLOCK_HALF: tl.constexpr, NEOX: tl.constexpr):
    """Rotate the pairs of ``BLOCK_ROWS`` rows; row ``r`` is at position ``r % seq_len``.

    Interleaved (``NEOX`` false): the tile is loaded and stored contiguously (wide, coalesced accesses) and split
    into its even and odd elements in registers; loading ``x[2i]`` and ``x[2i+1]`` as two stride-2 gathers instead
    issues narrow 2-byte loads and ran at 6% of an H100's bandwidth (labs/03-attention/01). NeoX: the two halves
    ``x[:d/2]`` and ``x[d/2:]`` are each contiguous, so two plain loads need no split at all.
    """
    rows = (tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[:, None]).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)[None, :]
    pair_mask = (rows < n_rows) & (i < half_dim)
    table = (rows % seq_len) * half_dim + i
    c = tl.load(cos_ptr + table, mask=pair_mask, other=0.0)
    s = tl.load(sin_ptr + table, mask=pair_mask, other=0.0)
    row_start = rows * 2 * half_dim
    if NEOX:
        first = tl.load(x_ptr + row_start + i, mask=pair_mask, other=0.0).to(tl.float32)
        second = tl.load(x_ptr + row_start + half_dim + i, mask=pair_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row_start + i, (first * c - second * s).to(y_ptr.dtype.element_ty), mask=pair_mask)
        tl.store(y_ptr + row_start + half_dim + i, (first * s + second * c).to(y_ptr.dtype.element_ty),
                 mask=pair_mask)
    else:
        cols = tl.arange(0, 2 * BLOCK_HALF)[None, :]
        mask = (rows < n_rows) & (cols < 2 * half_dim)
        x = tl.load(x_ptr + row_start + cols, mask=mask, other=0.0).to(tl.float32)
        even, odd = tl.split(tl.reshape(x, (BLOCK_ROWS, BLOCK_HALF, 2)))
        y = tl.reshape(tl.join(even * c - odd * s, even * s + odd * c), (BLOCK_ROWS, 2 * BLOCK_HALF))
        tl.store(y_ptr + row_start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "interleaved") -> torch.Tensor:
    """RoPE of ``x`` (contiguous, ``(..., seq, head_dim)``) with fp32 tables ``(seq, head_dim / 2)``.

    The same rotation as :func:`utils.attention.rope.apply_rope` in either ``layout``: ``"interleaved"`` pairs
    ``(x_{2i}, x_{2i+1})`` (Meta), ``"neox"`` pairs ``(x_i, x_{i+d/2})`` (Hugging Face, vLLM's
    ``is_neox_style``). Each program takes a tile of about 4096 elements (32 rows of head_dim 128).
    """
    check_tensors(x, cos, sin)
    check_layout(layout)
    _check_rows(x)
    if x.dim() < 2 or x.shape[-1] % 2:
        raise ValueError(f"x must be (..., seq, head_dim) with an even head_dim, got {tuple(x.shape)}")
    seq, half = x.shape[-2], x.shape[-1] // 2
    for name, table in (("cos", cos), ("sin", sin)):
        if table.shape != (seq, half) or table.dtype != torch.float32:
            raise ValueError(f"{name} must be float32 of shape ({seq}, {half}), got {table.dtype} {tuple(table.shape)}")
    y = torch.empty_like(x)
    n_rows = x.numel() // x.shape[-1]
    if n_rows:
        block_half = triton.next_power_of_2(half)
        block_rows = max(1, 2048 // block_half)
        rope_kernel[(triton.cdiv(n_rows, block_rows),)](x, cos.contiguous(), sin.contiguous(), y, n_rows, seq, half,
                                                        BLOCK_ROWS=block_rows, BLOCK_HALF=block_half,
                                                        NEOX=layout == "neox")
    return y


@triton.jit
def swiglu_gate_kernel(a_ptr, b_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    """``out = a * sigmoid(a) * b`` for one block of elements."""
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    a = tl.load(a_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offsets, (a * tl.sigmoid(a) * b).to(out_ptr.dtype.element_ty), mask=mask)


def swiglu_gate(a: torch.Tensor, b: torch.Tensor, block_size: int = 1024) -> torch.Tensor:
    """``SiLU(a) * b`` element-wise in one kernel; ``a`` and ``b`` contiguous, same shape and dtype."""
    check_tensors(a, b)
    if a.shape != b.shape or a.dtype != b.dtype or not (a.is_contiguous() and b.is_contiguous()):
        raise ValueError(f"a and b must be contiguous with the same shape and dtype, got {tuple(a.shape)} "
                         f"{a.dtype} and {tuple(b.shape)} {b.dtype}")
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    out = torch.empty_like(a)
    n = a.numel()
    if n:
        swiglu_gate_kernel[(triton.cdiv(n, block_size),)](a, b, out, n, BLOCK_SIZE=block_size)
    return out
