"""Floating-point formats of mixed-precision training, derived from their bit counts, and what they cost per parameter.

A binary floating-point format with ``e`` exponent bits and ``m`` (explicit)
mantissa bits stores ``(-1)^s * 1.f * 2^(E - bias)`` for a normal number, with
``bias = 2^(e-1) - 1``, and ``(-1)^s * 0.f * 2^(1 - bias)`` for a subnormal one
(exponent field 0) (IEEE 754-2019, section 3.4). From ``e`` and ``m`` alone:

- machine epsilon, the gap after 1.0: ``2^-m``;
- smallest normal: ``2^(1 - bias)``; smallest subnormal: ``2^(1 - bias - m)``;
- largest finite, when the all-ones exponent is kept for inf and NaN (IEEE
  formats and E5M2): ``(2 - 2^-m) * 2^(2^e - 2 - bias)``;
- largest finite of FP8 E4M3, which has no infinities and spends only the
  all-ones bit pattern on NaN, so its top exponent holds normal numbers:
  ``(2 - 2^(1-m)) * 2^(2^e - 1 - bias)`` = 448 (Micikevicius et al., "FP8
  Formats for Deep Learning", arXiv:2209.05433, section 3 and Table 1).

:data:`FORMATS` holds fp32, tf32, fp16, bf16, fp8 E4M3 and E5M2; the tests
check every derived value against ``torch.finfo`` where torch has the dtype,
against the bit patterns themselves, and against :data:`PUBLISHED`.
:func:`float_bits` splits a value into its sign, exponent and mantissa bits.
:func:`model_state_bytes_per_param` is the per-parameter memory bill of
training recipes, built from the constants of :mod:`utils.parallel.memory`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from utils.parallel.memory import ADAM_MIXED_PRECISION_OPTIMIZER_BYTES, FP16_GRAD_BYTES, FP16_PARAM_BYTES
from utils.published import Published


class FloatFormat(NamedTuple):
    """A binary floating-point format: 1 sign bit, ``exponent_bits``, ``mantissa_bits`` (explicit fraction bits).

    ``has_inf`` is False for FP8 E4M3, whose all-ones exponent holds normal
    numbers (only S.1111.111 is NaN). ``torch_dtype`` is the name of torch's
    dtype for it, or None (tf32 is a Tensor Core math mode, not a storage type).
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    has_inf: bool = True
    torch_dtype: str | None = None

    @property
    def bits(self) -> int:
        """Total bits: ``1 + e + m`` (tf32 has 19 significant bits, stored in 32)."""
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        """``2^(e-1) - 1``."""
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def eps(self) -> float:
        """Machine epsilon, the gap between 1.0 and the next larger number: ``2^-m``."""
        return 2.0 ** -self.mantissa_bits

    @property
    def smallest_normal(self) -> float:
        """``2^(1 - bias)``."""
        return 2.0 ** (1 - self.bias)

    @property
    def smallest_subnormal(self) -> float:
        """``2^(1 - bias - m)``: below half of it, a value rounds to zero (underflow)."""
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def max(self) -> float:
        """The largest finite value (see the module docstring for both formulas)."""
        e, m = self.exponent_bits, self.mantissa_bits
        if self.has_inf:
            return (2.0 - 2.0 ** -m) * 2.0 ** (2 ** e - 2 - self.bias)
        return (2.0 - 2.0 ** (1 - m)) * 2.0 ** (2 ** e - 1 - self.bias)

    @property
    def dynamic_range_decades(self) -> float:
        """``log10(max / smallest_subnormal)``: how many powers of ten the format spans."""
        return math.log10(self.max / self.smallest_subnormal)

    @property
    def dtype(self) -> torch.dtype | None:
        """The torch dtype, or None."""
        return getattr(torch, self.torch_dtype) if self.torch_dtype else None


FORMATS: dict[str, FloatFormat] = {
    "fp32": FloatFormat("fp32", 8, 23, True, "float32"),
    "tf32": FloatFormat("tf32", 8, 10, True, None),
    "fp16": FloatFormat("fp16", 5, 10, True, "float16"),
    "bf16": FloatFormat("bf16", 8, 7, True, "bfloat16"),
    "fp8_e4m3": FloatFormat("fp8_e4m3", 4, 3, False, "float8_e4m3fn"),
    "fp8_e5m2": FloatFormat("fp8_e5m2", 5, 2, True, "float8_e5m2"),
}
"""The formats of mixed-precision training, by name."""

_FP8 = "Micikevicius et al., 'FP8 Formats for Deep Learning', arXiv:2209.05433, Table 1"
_IEEE = "IEEE 754-2019 binary16 (half precision)"
_MP = "Micikevicius et al., 'Mixed Precision Training', arXiv:1710.03740, section 3.2"
_A100 = ("NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020), TF32; checked against the "
         "Wikipedia article TensorFloat-32, not the whitepaper itself")

PUBLISHED: dict[tuple[str, str], Published] = {
    ("fp8_e4m3", "max"): Published(448.0, "largest finite value", _FP8),
    ("fp8_e4m3", "smallest_normal"): Published(2.0 ** -6, "smallest normal value", _FP8),
    ("fp8_e4m3", "smallest_subnormal"): Published(2.0 ** -9, "smallest subnormal value", _FP8),
    ("fp8_e5m2", "max"): Published(57344.0, "largest finite value", _FP8),
    ("fp8_e5m2", "smallest_normal"): Published(2.0 ** -14, "smallest normal value", _FP8),
    ("fp8_e5m2", "smallest_subnormal"): Published(2.0 ** -16, "smallest subnormal value", _FP8),
    ("fp16", "max"): Published(65504.0, "largest finite value", _IEEE),
    ("fp16", "smallest_subnormal"): Published(2.0 ** -24, "smallest subnormal value; smaller values become 0", _MP),
    ("tf32", "mantissa_bits"): Published(10, "explicit mantissa bits (fp16's precision, fp32's 8-bit exponent)", _A100),
}
"""(format, property): the value printed in a primary source."""


def get_format(name: str) -> FloatFormat:
    """The :class:`FloatFormat` called ``name`` (a key of :data:`FORMATS`), else ``ValueError``."""
    if name not in FORMATS:
        raise ValueError(f"format must be one of {tuple(FORMATS)}, got {name!r}")
    return FORMATS[name]


class BitFields(NamedTuple):
    """A value as stored: ``sign`` (0 or 1), ``exponent`` and ``mantissa`` fields as bit strings, and the value."""

    sign: int
    exponent: str
    mantissa: str
    value: float


_INT_VIEW = {32: torch.int32, 16: torch.int16, 8: torch.uint8}


def float_bits(value: float, fmt: str) -> BitFields:
    """``value`` rounded to format ``fmt`` (round to nearest even, as torch's casts do), split into its bit fields.

    For dtypes torch has, the bits are the stored bytes of ``torch.tensor(value).to(dtype)``.
    tf32 is fp32 with the low 13 mantissa bits rounded away (to nearest even),
    as Tensor Cores read fp32 inputs in TF32 mode.
    """
    f = get_format(fmt)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"value must be a number, got {value!r}")
    x = torch.tensor([float(value)], dtype=torch.float32)
    if f.name == "tf32":
        raw = int(x.view(torch.int32).item()) & 0xFFFFFFFF
        if (raw >> 23) & 0xFF != 0xFF:  # finite: round the 13 dropped bits to nearest even
            raw = (raw + 0xFFF + ((raw >> 13) & 1)) & 0xFFFFE000
        stored = torch.tensor([raw if raw < 2 ** 31 else raw - 2 ** 32], dtype=torch.int32).view(torch.float32)
        total, payload = 32, raw >> 13
    else:
        stored = x.to(f.dtype)
        total = f.bits
        payload = int(stored.view(_INT_VIEW[total]).item()) & (2 ** total - 1)
    e, m = f.exponent_bits, f.mantissa_bits
    sign = payload >> (e + m)
    exponent = (payload >> m) & (2 ** e - 1)
    mantissa = payload & (2 ** m - 1)
    return BitFields(sign, format(exponent, f"0{e}b"), format(mantissa, f"0{m}b"), float(stored.float().item()))


def decode_bits(sign: int, exponent: str, mantissa: str, fmt: str) -> float:
    """The value of the bit fields in format ``fmt``: the inverse of :func:`float_bits`, by the formula.

    Normal: ``(-1)^s (1 + f / 2^m) 2^(E - bias)``; subnormal (E = 0):
    ``(-1)^s (f / 2^m) 2^(1 - bias)``; all-ones exponent: inf or NaN, except
    E4M3, where it is a normal number unless the mantissa is all ones too (NaN).
    """
    f = get_format(fmt)
    if sign not in (0, 1) or len(exponent) != f.exponent_bits or len(mantissa) != f.mantissa_bits \
            or set(exponent + mantissa) - {"0", "1"}:
        raise ValueError(f"{fmt} needs sign 0 or 1, {f.exponent_bits} exponent bits and {f.mantissa_bits} "
                         f"mantissa bits as strings of 0 and 1, got {sign!r}, {exponent!r}, {mantissa!r}")
    big_e, frac = int(exponent, 2), int(mantissa, 2)
    s = -1.0 if sign else 1.0
    all_ones = big_e == 2 ** f.exponent_bits - 1
    if all_ones and f.has_inf:
        return s * float("inf") if frac == 0 else float("nan")
    if all_ones and frac == 2 ** f.mantissa_bits - 1:
        return float("nan")
    if big_e == 0:
        return s * frac / 2 ** f.mantissa_bits * 2.0 ** (1 - f.bias)
    return s * (1 + frac / 2 ** f.mantissa_bits) * 2.0 ** (big_e - f.bias)


RECIPES = ("fp32", "mixed", "mixed-fp32-grads")


def model_state_bytes_per_param(recipe: str = "mixed") -> dict[str, int]:
    """Bytes per parameter of the model states of training with Adam, by kind.

    - ``"mixed"``: 16-bit weights and gradients (2 + 2) plus K = 12 bytes of
      fp32 optimizer state (master weight, momentum, variance), 16 in all
      (Rajbhandari et al., ZeRO, arXiv:1910.02054, section 3.1; the constants
      of :mod:`utils.parallel.memory`).
    - ``"mixed-fp32-grads"``: the same with the gradients accumulated and
      reduced in fp32 (4 bytes), 18 in all: Megatron-LM's bf16 recipe, which
      turns on ``accumulate_allreduce_grads_in_fp32`` for bf16 because "bfloat16
      requires gradient accumulation and all-reduce to be done in fp32"
      (``megatron/training/arguments.py``); its README's distributed-optimizer
      table counts 18 bytes for "bf16 param, fp32 grads".
    - ``"fp32"``: fp32 weights and gradients (4 + 4) and fp32 momentum and
      variance (8): also 16. Mixed precision saves time and activation
      memory, not model-state memory.
    """
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    fp32 = FORMATS["fp32"].bits // 8
    if recipe == "fp32":
        return {"fp32 weights": fp32, "fp32 gradients": fp32, "Adam momentum (fp32)": fp32,
                "Adam variance (fp32)": fp32}
    master = fp32
    moments = ADAM_MIXED_PRECISION_OPTIMIZER_BYTES - master
    gradients = {"16-bit gradients": FP16_GRAD_BYTES} if recipe == "mixed" else {"fp32 gradients": fp32}
    return {"16-bit weights": FP16_PARAM_BYTES, **gradients,
            "fp32 master weights": master, "Adam momentum (fp32)": moments // 2,
            "Adam variance (fp32)": moments - moments // 2}
