"""Weight-only group-wise quantisation (int8, int4) and a quantised KV cache (int8, FP8 e4m3), round to nearest.

**Weights.** A linear layer's weight ``w`` has shape ``(out_features, in_features)`` (``y = x @ w.T``,
PyTorch's ``nn.Linear`` layout). Each row is cut along the *input* dimension into groups of
``group_size`` consecutive columns, and every group gets its own scale ``s`` and integer zero point
``z`` (asymmetric quantisation)::

    s = (max(w_g, 0) - min(w_g, 0)) / (2**bits - 1)        z = round(-min(w_g, 0) / s)
    q = clamp(round(w / s) + z, 0, 2**bits - 1)             dequantize: w_hat = (q - z) * s

The range is widened to include 0, as GPTQ's quantiser does, so that ``z`` lies in ``[0, 2**bits - 1]``
and a group of zeros is exact (``s = 1``, ``z = 0`` then). Rounding to the nearest level gives
``|w - w_hat| <= s / 2`` for every weight of the group (up to float rounding of ``s``).

Group-wise scales are the layout of GPTQ (Frantar et al. 2022, arXiv:2210.17323) and AWQ (Lin et al.
2023, arXiv:2306.00978), but the *values* here are plain round-to-nearest: there is no GPTQ
error-compensating update of the not-yet-quantised columns (its inverse-Hessian step) and no AWQ
activation-aware per-channel scaling. This module is the baseline both papers improve on.

**Storage layout** (what :func:`utils.kernels.quant_matmul.quant_matmul` reads):

- ``bits = 8``: ``q`` is ``uint8``, shape ``(out_features, in_features)``, one level per byte.
- ``bits = 4``: ``q`` is ``uint8``, shape ``(out_features, in_features // 2)``, two levels per byte:
  byte ``j`` of a row holds column ``2j`` in its low nibble (bits 0-3) and column ``2j + 1`` in its
  high nibble (bits 4-7), i.e. ``byte = q[2j] | (q[2j + 1] << 4)``.
- ``scales``: shape ``(out_features, in_features // group_size)``, in ``w``'s dtype;
  ``zeros``: the same shape, ``uint8`` (integers ``0 .. 2**bits - 1``, one byte each, not packed).

**KV cache.** :func:`quantize_kv` / :func:`dequantize_kv` store keys or values of shape
``(..., n_kv_heads, head_dim)`` either as int8 with one symmetric scale per (token, head) vector,
``s = max|x| / 127``, ``q = round(x / s)``, or as FP8 e4m3 (``torch.float8_e4m3fn``, largest finite
value 448) with one scale for the whole tensor, ``s = max|x| / 448``.
"""

from __future__ import annotations

import torch

SUPPORTED_BITS = (4, 8)
KV_FORMATS = ("int8", "fp8_e4m3")
FP8_E4M3_MAX = 448.0
"""Largest finite value of float8 e4m3fn (``torch.finfo(torch.float8_e4m3fn).max``; Micikevicius et al. 2022,
arXiv:2209.05433, Table 1)."""


def check_bits_group(bits: int, group_size: int, in_features: int | None = None) -> None:
    """Raise ``ValueError`` unless ``bits`` is 4 or 8 and ``group_size`` an even integer >= 2 dividing ``in_features``."""
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits!r}")
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 2 or group_size % 2:
        raise ValueError(f"group_size must be an even integer >= 2, got {group_size!r}")
    if in_features is not None and in_features % group_size:
        raise ValueError(f"group_size ({group_size}) must divide in_features ({in_features}): every group "
                         "covers group_size whole columns of one row")


def quantize(w: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest asymmetric quantisation of ``w`` (``(out_features, in_features)``), one scale and zero
    point per ``group_size`` input columns. Returns ``(q, scales, zeros)`` in the layout of the module docstring.
    """
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D floating-point tensor (out_features, in_features), got "
                         f"{getattr(w, 'shape', type(w).__name__)}")
    check_bits_group(bits, group_size, w.shape[1])
    out_features, in_features = w.shape
    maxq = 2**bits - 1
    groups = w.float().reshape(out_features, in_features // group_size, group_size)
    lo = groups.amin(dim=-1).clamp(max=0)
    hi = groups.amax(dim=-1).clamp(min=0)
    scale = (hi - lo) / maxq
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))   # an all-zero group: s = 1, z = 0
    scale = scale.to(w.dtype).float()                               # the scale the kernel will read
    zero = torch.round(-lo / scale).clamp(0, maxq)
    q = torch.clamp(torch.round(groups / scale[..., None]) + zero[..., None], 0, maxq).to(torch.uint8)
    q = q.reshape(out_features, in_features)
    if bits == 4:
        q = q[:, 0::2] | (q[:, 1::2] << 4)
    return q.contiguous(), scale.to(w.dtype), zero.to(torch.uint8)


def unpack_int4(q: torch.Tensor) -> torch.Tensor:
    """The levels of a packed int4 tensor, ``(rows, cols // 2)`` bytes to ``(rows, cols)`` uint8 (low nibble first)."""
    if q.dtype != torch.uint8 or q.dim() != 2:
        raise ValueError(f"packed int4 weights are a 2-D uint8 tensor, got {q.dtype} of shape {tuple(q.shape)}")
    return torch.stack((q & 0xF, q >> 4), dim=-1).reshape(q.shape[0], 2 * q.shape[1])


def dequantize(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int, bits: int
               ) -> torch.Tensor:
    """``w_hat = (q - z) * s`` group by group: the weight :func:`quantize` stands for, in ``scales``' dtype."""
    check_bits_group(bits, group_size)
    levels = unpack_int4(q) if bits == 4 else q
    if levels.dim() != 2 or levels.dtype != torch.uint8:
        raise ValueError(f"q must be a 2-D uint8 tensor, got {q.dtype} of shape {tuple(q.shape)}")
    out_features, in_features = levels.shape
    n_groups = in_features // group_size
    if in_features % group_size or scales.shape != (out_features, n_groups) or zeros.shape != scales.shape:
        raise ValueError(f"for {bits}-bit weights of shape ({out_features}, {in_features}) in groups of {group_size}, "
                         f"scales and zeros must both be ({out_features}, {n_groups}); got {tuple(scales.shape)} "
                         f"and {tuple(zeros.shape)}")
    groups = levels.float().reshape(out_features, n_groups, group_size)
    w = (groups - zeros.float()[..., None]) * scales.float()[..., None]
    return w.reshape(out_features, in_features).to(scales.dtype)


def fake_quantize(w: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """``dequantize(*quantize(w, bits, group_size), group_size, bits)``: ``w`` rounded to its quantised values, in
    ``w``'s dtype and shape (to measure what quantisation does to a model's outputs without a quantised kernel)."""
    return dequantize(*quantize(w, bits, group_size), group_size, bits)


def bytes_per_weight(bits: int, group_size: int, scale_bytes: int = 2, zero_bytes: int = 1) -> float:
    """Bytes of memory per weight, scales and zero points included: ``bits / 8 + (scale_bytes + zero_bytes) / group_size``.

    With this module's layout (fp16 scales, uint8 zeros) int4 in groups of 128 costs
    ``0.5 + 3 / 128 = 0.523`` bytes per weight against fp16's 2: what decode reads per parameter per step.
    """
    check_bits_group(bits, group_size)
    for name, value in (("scale_bytes", scale_bytes), ("zero_bytes", zero_bytes)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return bits / 8 + (scale_bytes + zero_bytes) / group_size


def quantize_kv(x: torch.Tensor, fmt: str = "int8", scale: float | torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise keys or values ``x`` of shape ``(..., n_kv_heads, head_dim)``; returns ``(data, scale)``.

    ``"int8"``: symmetric, one scale per (token, head) vector, ``scale`` of shape ``x.shape[:-1]``;
    ``|x - dequantize_kv| <= scale / 2``. ``"fp8_e4m3"``: ``torch.float8_e4m3fn`` with one per-tensor scale
    (a 0-d tensor); e4m3 keeps 3 mantissa bits, so each element's error is at most ``2**-4 * |x|`` (normal
    numbers) or ``2**-10 * scale`` (subnormals, below ``2**-6 * scale``).

    ``scale`` (FP8 only) fixes the per-tensor scale instead of computing ``max|x| / 448`` from ``x``: a cache
    written a few tokens at a time keeps one *static* scale, as vLLM's FP8 cache does (its ``k_scale`` and
    ``v_scale``, 1.0 unless calibrated); values beyond ``448 * scale`` saturate to +-448.
    """
    if fmt not in KV_FORMATS:
        raise ValueError(f"fmt must be one of {KV_FORMATS}, got {fmt!r}")
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or not x.is_floating_point():
        raise ValueError("x must be a floating-point tensor of shape (..., n_kv_heads, head_dim)")
    xf = x.float()
    if scale is not None:
        if fmt != "fp8_e4m3":
            raise ValueError("a fixed scale is for the FP8 cache only; int8 computes one scale per vector")
        scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
        if scale.dim() != 0 or not bool(torch.isfinite(scale)) or float(scale) <= 0:
            raise ValueError(f"scale must be one positive finite number, got {scale}")
        return (xf / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn), scale
    if fmt == "int8":
        scale = xf.abs().amax(dim=-1) / 127
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        return torch.round(xf / scale[..., None]).clamp(-127, 127).to(torch.int8), scale
    scale = xf.abs().amax() / FP8_E4M3_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (xf / scale).to(torch.float8_e4m3fn), scale


def dequantize_kv(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The keys or values :func:`quantize_kv` stands for: ``data * scale`` (per vector for int8, per tensor for FP8)."""
    if data.dtype == torch.int8:
        if scale.shape != data.shape[:-1]:
            raise ValueError(f"an int8 cache has one scale per vector: scale must be {tuple(data.shape[:-1])}, "
                             f"got {tuple(scale.shape)}")
        return (data.float() * scale[..., None]).to(dtype)
    if data.dtype == torch.float8_e4m3fn:
        if scale.dim() != 0:
            raise ValueError(f"an FP8 cache has one scale per tensor (0-d), got shape {tuple(scale.shape)}")
        return (data.float() * scale).to(dtype)
    raise ValueError(f"data must be int8 or float8_e4m3fn (from quantize_kv), got {data.dtype}")


def kv_bytes_per_element(fmt: str, head_dim: int, scale_bytes: int = 4) -> float:
    """Bytes per cached element, scales included: int8 ``1 + scale_bytes / head_dim``; FP8 1 (one scale per tensor)."""
    if fmt not in KV_FORMATS:
        raise ValueError(f"fmt must be one of {KV_FORMATS}, got {fmt!r}")
    if not isinstance(head_dim, int) or head_dim < 1:
        raise ValueError(f"head_dim must be a positive integer, got {head_dim!r}")
    return 1 + scale_bytes / head_dim if fmt == "int8" else 1.0
