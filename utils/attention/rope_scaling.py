"""Long-context RoPE: what position interpolation, NTK-aware scaling, YaRN and Llama 3.1 do to each ``theta_i``.

A model trained at context ``L`` has seen pair ``i`` turn through at most
``L * theta_i`` radians. To run it at ``s * L`` tokens (``s`` = ``factor``), each
method replaces the frequencies ``theta_i = base^(-2i/d)`` of
:func:`utils.attention.rope.rope_frequencies` by new ones (Hugging Face's
``inv_freq``, ``transformers/modeling_rope_utils.py``; the ``rope_scaling`` /
``rope_type`` of a ``config.json``):

- **Position interpolation** (Chen et al. 2023, arXiv:2306.15595; HF ``"linear"``):
  every ``theta_i / s``. Positions ``0 .. sL`` are squeezed into ``0 .. L``.
- **NTK-aware** (bloc97 2023, written up in Peng et al. 2023, arXiv:2309.00071, section 3.1;
  HF ``"ntk"``; ``"dynamic"`` recomputes it from the current length): a larger base,
  ``base' = base * s^(d/(d-2))``, so pair 0 is untouched and the slowest pair is slowed
  by exactly ``s``.
- **YaRN** (Peng et al. 2023, section 3.2, "NTK-by-parts", plus an attention
  temperature; HF ``"yarn"``; DeepSeek-V2 uses it with ``s = 40`` from 4K): pairs that
  turn more than ``beta_fast = 32`` times in ``L`` tokens keep ``theta_i``, pairs that turn
  less than ``beta_slow = 1`` time get ``theta_i / s``, and a linear ramp over pair
  indices blends between; a temperature ``sqrt(1/t) = 0.1 ln s + 1`` scales cos and sin (so the
  attention logits by its square). DeepSeek-V2 sets ``mscale`` 0.707 in its ``config.json``:
  ``sqrt(1/t) = 0.0707 ln s + 1`` (about 1.261 at ``s = 40``), applied by its code as a softmax
  scale of its square (about 1.59), cos and sin left alone.
- **Llama 3.1** (HF ``"llama3"``; Meta's ``apply_scaling`` in llama-models): the same
  idea by wavelength ``lambda_i = 2 pi / theta_i``: unchanged below
  ``L / high_freq_factor``, ``theta_i / s`` above ``L / low_freq_factor``, and between,
  ``(1 - g) theta_i / s + g theta_i`` with ``g = (L / lambda_i - low) / (high - low)``.
  Llama 3.1's ``config.json``: factor 8, low 1, high 4, ``L`` = 8192.
"""

from __future__ import annotations

import math

import torch

from utils.attention.rope import rope_frequencies
from utils.validate import check_positive, check_positive_int

KINDS = ("default", "linear", "ntk", "yarn", "llama3")
"""The scalings :func:`scaled_frequencies` knows, by their Hugging Face ``rope_type``."""


def _check_factor(factor: float) -> float:
    check_positive("factor", factor, finite=True)
    if factor < 1:
        raise ValueError(f"factor extends the context, so it must be >= 1, got {factor}")
    return float(factor)


def linear_frequencies(head_dim: int, base: float, factor: float) -> torch.Tensor:
    """Position interpolation: ``theta_i / factor`` for every pair (Chen et al. 2023, eq. 4)."""
    return rope_frequencies(head_dim, base) / _check_factor(factor)


def ntk_frequencies(head_dim: int, base: float, factor: float) -> torch.Tensor:
    """NTK-aware scaling: ``theta_i`` of the base ``base * factor^(d/(d-2))`` (YaRN paper, eq. 16)."""
    _check_factor(factor)
    check_positive_int("head_dim", head_dim)
    if head_dim < 4:
        raise ValueError(f"NTK-aware scaling needs head_dim >= 4 (it divides by d - 2), got {head_dim}")
    return rope_frequencies(head_dim, base * factor ** (head_dim / (head_dim - 2)))


def yarn_correction_dim(n_rotations: float, head_dim: int, base: float, original_context: int) -> float:
    """The (fractional) pair index ``i`` whose pair turns ``n_rotations`` times in ``original_context`` tokens.

    Solves ``original_context * theta_i = 2 pi n_rotations`` for ``i``:
    ``d ln(L / (2 pi n)) / (2 ln base)`` (HF's and DeepSeek's ``find_correction_dim``).
    """
    return head_dim * math.log(original_context / (n_rotations * 2 * math.pi)) / (2 * math.log(base))


def yarn_frequencies(head_dim: int, base: float, factor: float, original_context: int,
                     beta_fast: float = 32.0, beta_slow: float = 1.0, mscale: float = 1.0) -> tuple[torch.Tensor, float]:
    """YaRN's frequencies and its attention factor ``sqrt(1/t) = 0.1 mscale ln(factor) + 1`` (Peng et al. 2023, eqs. 18-22).

    ``mscale = 1`` is the paper's ``0.1 ln s + 1``, which multiplies cos and sin (the logits by its square).
    DeepSeek-V2's ``config.json`` sets ``mscale = mscale_all_dim = 0.707``: ``0.0707 ln s + 1``, which its code
    (``yarn_get_mscale``) applies as a softmax scale of ``factor**2``, leaving cos and sin alone (they are scaled
    by the ratio of the two ``yarn_get_mscale`` values, 1).

    As served (HF ``_compute_yarn_parameters``, DeepSeek's ``yarn_find_correction_range``): the ramp runs over pair
    indices from ``floor(correction_dim(beta_fast))`` to ``ceil(correction_dim(beta_slow))``, clipped to
    ``[0, d - 1]``; ``gamma = clamp((i - low) / (high - low), 0, 1)`` and
    ``theta'_i = theta_i / factor * gamma + theta_i * (1 - gamma)``.
    """
    theta = rope_frequencies(head_dim, base)
    factor = _check_factor(factor)
    check_positive_int("original_context", original_context)
    if not beta_fast > beta_slow > 0:
        raise ValueError(f"need beta_fast > beta_slow > 0, got {beta_fast} and {beta_slow}")
    if not mscale > 0:
        raise ValueError(f"mscale must be positive (1 for YaRN's paper, 0.707 for DeepSeek-V2), got {mscale}")
    low = max(math.floor(yarn_correction_dim(beta_fast, head_dim, base, original_context)), 0)
    high = min(math.ceil(yarn_correction_dim(beta_slow, head_dim, base, original_context)), head_dim - 1)
    if low == high:
        high += 0.001                                      # HF: "prevent singularity"
    gamma = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return theta / factor * gamma + theta * (1 - gamma), 0.1 * mscale * math.log(factor) + 1.0


def llama3_frequencies(head_dim: int, base: float = 500000.0, factor: float = 8.0, low_freq_factor: float = 1.0,
                       high_freq_factor: float = 4.0, original_context: int = 8192) -> torch.Tensor:
    """Llama 3.1's frequency scaling (HF ``_compute_llama3_parameters``; defaults from Llama 3.1's ``config.json``).

    With ``lambda_i = 2 pi / theta_i``: ``theta_i`` if ``lambda_i < L / high_freq_factor``; ``theta_i / factor`` if
    ``lambda_i > L / low_freq_factor``; otherwise ``(1 - g) theta_i / factor + g theta_i`` with
    ``g = (L / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``.
    """
    theta = rope_frequencies(head_dim, base)
    factor = _check_factor(factor)
    check_positive_int("original_context", original_context)
    if not high_freq_factor > low_freq_factor > 0:
        raise ValueError(f"need high_freq_factor > low_freq_factor > 0, got {high_freq_factor} and {low_freq_factor}")
    wavelength = 2 * math.pi / theta
    g = (original_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - g) * theta / factor + g * theta
    out = torch.where(wavelength > original_context / low_freq_factor, theta / factor, smoothed)
    return torch.where(wavelength < original_context / high_freq_factor, theta, out)


def scaled_frequencies(kind: str, head_dim: int = 128, base: float = 10000.0, factor: float = 8.0,
                       original_context: int = 4096) -> torch.Tensor:
    """``theta'_i`` of one of :data:`KINDS` with each method's published defaults for its other parameters."""
    if kind == "default":
        return rope_frequencies(head_dim, base)
    if kind == "linear":
        return linear_frequencies(head_dim, base, factor)
    if kind == "ntk":
        return ntk_frequencies(head_dim, base, factor)
    if kind == "yarn":
        return yarn_frequencies(head_dim, base, factor, original_context)[0]
    if kind == "llama3":
        return llama3_frequencies(head_dim, base, factor, original_context=original_context)
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
