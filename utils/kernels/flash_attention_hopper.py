"""FlashAttention forward for Hopper: TMA tile loads, a causal loop split at the diagonal, tuned tiles.

Same algorithm as :mod:`utils.kernels.flash_attention` (FlashAttention-2's
forward, Dao 2023, arXiv:2307.08691, Algorithm 1: one program per ``BLOCK_M``
query rows of one head, an online softmax over ``BLOCK_N``-key tiles). What
changes is how the work reaches the Tensor Cores, following Triton's
fused-attention tutorial (triton-lang/triton, ``python/tutorials/06-fused-attention.py``):

1. **TMA loads.** Q, K, V and O are handed to the kernel as *tensor
   descriptors* (``triton.tools.tensor_descriptor.TensorDescriptor``, built on
   the host over the ``(batch * heads * n, head_dim)`` view). ``desc.load([row, 0])``
   is one bulk copy of a whole tile by the Tensor Memory Accelerator into
   shared memory, issued by one thread and tracked by a barrier, so the warps
   spend no instructions on addresses or masks and the next K/V tile streams in
   while the current one is multiplied.
2. **No masks where none are needed.** A non-causal tile needs no mask at all
   (the sequence is a multiple of the tile). A causal program walks the tiles
   left of its diagonal block without a mask, then the one diagonal block with
   it; tiles right of the diagonal are never loaded. (The portable kernel,
   :mod:`utils.kernels.flash_attention`, splits its causal loop the same way;
   a mask on every tile costs a compare and a select per score.)
3. **Scale folded into the exponent.** Scores stay unscaled until the row
   maximum is taken; ``exp2(s * log2(e) * scale - m)`` is one fused
   multiply-add and one ``ex2`` per score, and ``acc = tl.dot(p, v, acc)``
   accumulates in place.
4. **Heavy programs first.** For causal attention the last query tiles have
   the most keys; the grid is walked from the last tile to the first, so the
   longest programs start first and the short ones fill the tail.
5. **Tuned tiles.** :data:`TUNED_CONFIGS` holds the fastest tile shapes, warps
   and stages of the sweep recorded on an H100 (``benchmarks.hopper_kernels``);
   :func:`flash_attention_hopper` autotunes over them on a GPU.

Warp specialisation (one warp group loading, others computing, as
FlashAttention-3 does) is left to the compiler: the Triton 3.6 installed on
the book's H100 documents ``tl.range(..., warp_specialize=True)`` as supported
on Blackwell only.

The backward is :func:`utils.kernels.flash_attention_backward.flash_attention_backward`.
Sequence lengths must be multiples of 128 (use :func:`utils.kernels.flash_attention.flash_attention`
for any length). Under Triton's CPU interpreter it runs in fp32 and fp16.
"""

from __future__ import annotations

import math

import torch

from utils.attention.flash_reference import check_qkv
from utils.device import HAS_TRITON, INTERPRETER, check_tensors
from utils.kernels.triton_or_stand_in import tl, triton

if HAS_TRITON:
    from triton.tools.tensor_descriptor import TensorDescriptor

HEAD_DIMS = (16, 32, 64, 128)
SEQ_MULTIPLE = 128
"""Sequence lengths must be multiples of this, the largest query tile: tiles then never straddle two heads."""


@triton.jit
def _attend(acc, l_i, m_i, q, k_desc, v_desc, row0, lo, hi, offs_m, qk_scale,
            BLOCK_N: tl.constexpr, DIAGONAL: tl.constexpr):
    """Online softmax over key tiles ``lo .. hi`` of one head; only the DIAGONAL block is masked."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = k_desc.load([row0 + start_n, 0])
        s = tl.dot(q, k.T)
        if DIAGONAL:
            visible = offs_m[:, None] >= (start_n + offs_n)[None, :]
            s = s * qk_scale + tl.where(visible, 0.0, -1.0e6)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            s = s - m_new[:, None]
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            s = s * qk_scale - m_new[:, None]
        p = tl.math.exp2(s)
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = v_desc.load([row0 + start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def flash_forward_tma_kernel(q_desc, k_desc, v_desc, o_desc, LSE, sm_scale, n_ctx,
                             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             CAUSAL: tl.constexpr):
    """Program (i, b*h) writes O and the log-sum-exp L for one tile of query rows of one head."""
    tl.static_assert(BLOCK_M % BLOCK_N == 0)
    start_m = tl.program_id(0)
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - start_m  # heavy tiles (many keys) first
    bh = tl.program_id(1)
    row0 = bh * n_ctx  # this head's first row in the flattened (batch * heads * n, head_dim) tensors
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): exp(x) = exp2(x * log2(e))
    q = q_desc.load([row0 + start_m * BLOCK_M, 0])
    if CAUSAL:
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_desc, v_desc, row0, 0, start_m * BLOCK_M, offs_m, qk_scale,
                                BLOCK_N, False)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_desc, v_desc, row0, start_m * BLOCK_M, (start_m + 1) * BLOCK_M,
                                offs_m, qk_scale, BLOCK_N, True)
    else:
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_desc, v_desc, row0, 0, n_ctx, offs_m, qk_scale, BLOCK_N, False)
    o_desc.store([row0 + start_m * BLOCK_M, 0], (acc / l_i[:, None]).to(o_desc.dtype))
    tl.store(LSE + row0 + offs_m, (m_i + tl.math.log2(l_i)) * 0.6931471805599453)  # natural log: times ln(2)


def _config(block_m: int, block_n: int, warps: int, stages: int) -> triton.Config:
    return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=warps, num_stages=stages,
                         pre_hook=_set_block_shapes)


def _set_block_shapes(nargs: dict) -> None:
    """Autotune's pre-hook: each candidate's tile sides become the descriptors' block shapes."""
    d = nargs["HEAD_DIM"]
    nargs["q_desc"].block_shape = nargs["o_desc"].block_shape = [nargs["BLOCK_M"], d]
    nargs["k_desc"].block_shape = nargs["v_desc"].block_shape = [nargs["BLOCK_N"], d]


SWEEP_CONFIGS: tuple[tuple[int, int, int, int], ...] = tuple(
    (bm, bn, w, s) for bm, bn in ((128, 64), (128, 128), (64, 64)) for w in (4, 8) for s in (2, 3, 4)
    if not (bm * bn < 128 * 128 and w == 8 and bm == 64))
"""(BLOCK_M, BLOCK_N, warps, stages) that ``benchmarks.hopper_kernels`` times on a GPU."""

DEFAULT_CONFIG = (128, 64, 4, 2)
"""(BLOCK_M, BLOCK_N, warps, stages): the fastest non-causal configuration of the sweep on an H100."""

TUNED_CONFIGS: tuple[tuple[int, int, int, int], ...] = ((128, 64, 4, 2), (64, 64, 4, 3), (128, 128, 8, 3))
"""The candidates :func:`flash_attention_hopper` autotunes over on a GPU, keyed on (n, head_dim, causal): the
three fastest of the sweep recorded on an H100 (``benchmarks/results/hopper_sweep-h100-sxm.txt``, 2026-11-26,
b4 h16 n4096 d128 fp16): 545, 513 and 509 TFLOP/s non-causal; causal, 457, 474 and 437."""

flash_forward_tma_autotuned = triton.autotune(
    configs=[_config(*c) for c in TUNED_CONFIGS], key=["n_ctx", "HEAD_DIM", "CAUSAL"])(flash_forward_tma_kernel)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> None:
    check_qkv(q, k, v, causal)
    check_tensors(q, k, v)
    allowed = (torch.float16, torch.bfloat16) + ((torch.float32,) if INTERPRETER else ())
    if q.dtype not in allowed:
        raise ValueError(f"dtype must be one of {', '.join(map(str, allowed))} here, got {q.dtype}")
    if q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k and v must have one shape (batch, heads, n, head_dim), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {q.shape[-1]}")
    if q.shape[2] % SEQ_MULTIPLE:
        raise ValueError(f"the sequence length must be a multiple of {SEQ_MULTIPLE}, got {q.shape[2]}; "
                         "utils.kernels.flash_attention.flash_attention takes any length")


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  sm_scale: float | None = None, config: tuple[int, int, int, int] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """O and the natural-log log-sum-exp ``L`` (float32, ``(batch * heads, n)``) of ``softmax(Q K^T s) V``.

    ``config`` is ``(BLOCK_M, BLOCK_N, warps, stages)``; None autotunes over :data:`TUNED_CONFIGS` on a GPU
    and uses :data:`DEFAULT_CONFIG` (tiles capped at 64 for speed) in the interpreter.
    """
    _check(q, k, v, causal)
    batch, heads, n, d = q.shape
    q, k, v = (t.contiguous() for t in (q, k, v))
    scale = 1 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    out = torch.empty_like(q)
    lse = torch.empty((batch * heads, n), dtype=torch.float32, device=q.device)
    rows = batch * heads * n
    if config is None and INTERPRETER:
        config = (64, 32, 4, 1)
    bm, bn = (config[0], config[1]) if config else (16, 16)  # placeholders: the autotuner's pre-hook sets them
    descs = [TensorDescriptor(t.view(rows, d), [rows, d], [d, 1], [bm if i in (0, 3) else bn, d])
             for i, t in enumerate((q, k, v, out))]
    if config is None:
        grid = lambda meta: (n // meta["BLOCK_M"], batch * heads)  # noqa: E731
        flash_forward_tma_autotuned[grid](*descs, lse, scale, n, HEAD_DIM=d, CAUSAL=causal)
    else:
        block_m, block_n, warps, stages = config
        if block_m % block_n or SEQ_MULTIPLE % block_m:
            raise ValueError(f"BLOCK_M must divide {SEQ_MULTIPLE} and be a multiple of BLOCK_N, got {config[:2]}")
        flash_forward_tma_kernel[(n // block_m, batch * heads)](
            *descs, lse, scale, n, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
            num_warps=warps, num_stages=stages)
    return out, lse


class FlashAttentionHopper(torch.autograd.Function):
    """The TMA forward above; the fused FlashAttention-2 backward of :mod:`utils.kernels.flash_attention_backward`."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, config):
        out, lse = flash_forward(q, k, v, causal, sm_scale, config)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (causal, 1 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale))
        return out

    @staticmethod
    def backward(ctx, d_out):
        from utils.kernels.flash_attention_backward import flash_attention_backward

        q, k, v, out, lse = ctx.saved_tensors
        causal, scale = ctx.args
        dq, dk, dv = flash_attention_backward(q.contiguous(), k.contiguous(), v.contiguous(), out, lse,
                                              d_out.contiguous(), causal, scale)
        return dq, dk, dv, None, None, None


def flash_attention_hopper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                           sm_scale: float | None = None, config: tuple[int, int, int, int] | None = None
                           ) -> torch.Tensor:
    """``softmax(Q K^T * sm_scale) V``, differentiable, by the Hopper kernels of this module.

    ``q``, ``k``, ``v`` are ``(batch, heads, n, head_dim)`` of one dtype (float16 or bfloat16 on a GPU;
    float32 or float16 in the interpreter), ``n`` a multiple of 128, ``head_dim`` one of :data:`HEAD_DIMS`.
    ``causal`` masks key ``j > i`` for query ``i``; ``sm_scale`` defaults to ``1 / sqrt(head_dim)``.
    """
    return FlashAttentionHopper.apply(q, k, v, causal, sm_scale, config)
