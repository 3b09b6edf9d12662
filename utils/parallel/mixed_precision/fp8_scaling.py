"""Fine-grained FP8 scaling: one scale per 1x128 activation tile and per 128x128 weight block.

An FP8 cast keeps a tensor in range by scaling it first: ``q = fp8(x * s)``,
``x ~ q / s``, with ``s = max_fp8 / amax`` so the largest magnitude lands on
the format's largest value (448 for E4M3). With one scale per tensor
(Transformer Engine's recipes, and the FP8 chapter's per-tensor scaling) a
single outlier sets ``amax`` for every element: the rest are pushed towards
the format's subnormals, where fewer mantissa bits remain, or below its
smallest value, where they become 0.

DeepSeek-V3 (DeepSeek-AI, arXiv:2412.19437, section 3.3) scales more finely:
activations per 1x128 tile (one token, 128 channels) and weights per 128x128
block (128 output by 128 input channels), each with its own fp32 scale from
its own amax, computed online, all in E4M3. An outlier then costs precision
only inside its tile or block. :func:`quantize_blockwise` does this for any
2-D block shape, so the same function gives the per-tensor cast (one block the
size of the tensor), the 1x128 tiles and the 128x128 blocks, using torch's own
``float8_e4m3fn`` and ``float8_e5m2`` dtypes for the rounding.
:func:`dequantize_blockwise` undoes the scaling; :func:`quantization_error`
measures what the round trip lost.

Values are clamped to +-max before the cast: torch saturates out-of-range
E4M3 casts only from version 2.12 on (pytorch/pytorch#178817) and gives NaN
for ``|x| >= 480`` before, and ``x * s`` can round a hair above the maximum.
"""

from __future__ import annotations

import torch

from utils.parallel.mixed_precision.precision import FORMATS
from utils.validate import check_positive_int

ACTIVATION_TILE = (1, 128)
"""DeepSeek-V3's activation tile: one token by 128 channels (arXiv:2412.19437, section 3.3)."""
WEIGHT_BLOCK = (128, 128)
"""DeepSeek-V3's weight block: 128 output by 128 input channels (arXiv:2412.19437, section 3.3)."""
FP8_FORMATS = ("fp8_e4m3", "fp8_e5m2")


def _check(x: torch.Tensor, block: tuple[int, int], fmt: str) -> tuple[int, int]:
    if fmt not in FP8_FORMATS:
        raise ValueError(f"fmt must be one of {FP8_FORMATS}, got {fmt!r}")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x must be a 2-D floating-point tensor, got {getattr(x, 'shape', type(x))}")
    if not isinstance(block, tuple) or len(block) != 2:
        raise ValueError(f"block must be a pair (rows, cols), got {block!r}")
    br, bc = (check_positive_int(name, v) for name, v in (("block rows", block[0]), ("block cols", block[1])))
    if x.shape[0] % br or x.shape[1] % bc:
        raise ValueError(f"the block {block} must divide the tensor's shape {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise ValueError("x must be finite: an inf or NaN has no scale")
    return br, bc


def _blocks(x: torch.Tensor, br: int, bc: int) -> torch.Tensor:
    """View (R, C) as (R/br, br, C/bc, bc)."""
    return x.reshape(x.shape[0] // br, br, x.shape[1] // bc, bc)


def quantize_blockwise(x: torch.Tensor, block: tuple[int, int],
                       fmt: str = "fp8_e4m3") -> tuple[torch.Tensor, torch.Tensor]:
    """Cast ``x`` to FP8 with one scale per ``block``: ``(q, scales)``, ``q * (1/s)`` per block approximates ``x``.

    ``scales[i, j] = max_fp8 / amax`` of block (i, j) in fp32 (1 for an
    all-zero block), so each block's largest magnitude maps to the format's
    maximum. ``block = tuple(x.shape)`` is per-tensor scaling;
    :data:`ACTIVATION_TILE` and :data:`WEIGHT_BLOCK` are DeepSeek-V3's.
    """
    br, bc = _check(x, block, fmt)
    f = FORMATS[fmt]
    xb = _blocks(x.float(), br, bc)
    amax = xb.abs().amax(dim=(1, 3))
    scales = torch.where(amax > 0, f.max / amax, torch.ones_like(amax))
    scaled = (xb * scales[:, None, :, None]).clamp(-f.max, f.max)
    return scaled.reshape(x.shape).to(f.dtype), scales


def dequantize_blockwise(q: torch.Tensor, scales: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``q / s`` block by block, in fp32: the inverse of :func:`quantize_blockwise` up to its rounding."""
    if q.dtype not in (FORMATS[n].dtype for n in FP8_FORMATS):
        raise ValueError(f"q must be an FP8 tensor, got {q.dtype}")
    br, bc = _check(q.float(), block, "fp8_e4m3")
    if scales.shape != (q.shape[0] // br, q.shape[1] // bc):
        raise ValueError(f"scales has shape {tuple(scales.shape)}, expected {(q.shape[0] // br, q.shape[1] // bc)} "
                         f"for blocks {block} of a {tuple(q.shape)} tensor")
    return (_blocks(q.float(), br, bc) / scales[:, None, :, None]).reshape(q.shape)


def fake_quantize(x: torch.Tensor, block: tuple[int, int], fmt: str = "fp8_e4m3") -> torch.Tensor:
    """The round trip ``dequantize(quantize(x))`` in fp32: what an FP8 GEMM with these scales sees of ``x``."""
    q, scales = quantize_blockwise(x, block, fmt)
    return dequantize_blockwise(q, scales, block)


def quantization_error(x: torch.Tensor, block: tuple[int, int], fmt: str = "fp8_e4m3") -> dict[str, float]:
    """What the round trip loses, over the nonzero elements of ``x``: the ``median relative error``
    ``|fake_quantize(x) - x| / |x|`` (an element's own precision, which outliers elsewhere in its block
    degrade), and ``zeroed``, the fraction that became 0."""
    r = fake_quantize(x, block, fmt)
    x = x.float()
    nonzero = x != 0
    if not nonzero.any():
        raise ValueError("x has no nonzero element to measure an error on")
    rel = ((r - x).abs() / x.abs())[nonzero]
    return {"median relative error": float(rel.median()), "zeroed": float((r[nonzero] == 0).float().mean())}
