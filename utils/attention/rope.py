"""Rotary position embedding (RoPE) in its two memory layouts, and the weight permutation between them.

RoPE (Su et al. 2021, arXiv:2104.09864) rotates ``d/2`` pairs of a query or key
vector at position ``m``, pair ``i`` by the angle ``m * theta_i`` with
``theta_i = base^(-2i/d)``. Which two dimensions form pair ``i`` is a choice of
layout, and codebases differ:

- ``"interleaved"`` pairs ``(x_{2i}, x_{2i+1})``: the paper's form, Meta's
  reference code (``apply_rotary_emb`` in facebookresearch/llama ``model.py``,
  through ``torch.view_as_complex``), vLLM's ``is_neox_style=False`` ("GPT-J
  style"), FlashAttention's ``apply_rotary_emb(..., interleaved=True)``.
- ``"neox"`` pairs ``(x_i, x_{i + d/2})``: GPT-NeoX, Hugging Face's
  ``LlamaAttention`` (``rotate_half``), vLLM's ``is_neox_style=True`` and
  FlashAttention's default ``interleaved=False``.

Both compute the same rotation after a permutation of the head's dimensions:
``rope_neox(x[perm]) = rope_interleaved(x)[perm]`` with
``perm = [0, 2, 4, ..., d-2, 1, 3, ..., d-1]`` (:func:`neox_permutation`). So a
checkpoint trained with one layout runs under the other if the rows of ``W_q``
and ``W_k`` are permuted head by head; Hugging Face's
``convert_llama_weights_to_hf.py`` does exactly that (its ``permute``:
``w.view(n_heads, d/2, 2, dim).transpose(1, 2)``), which is
:func:`permute_rows_to_neox`. Scores ``q . k`` are unchanged because the same
permutation hits ``q`` and ``k``.
"""

from __future__ import annotations

import torch

from utils.validate import check_positive, check_positive_int

LAYOUTS = ("interleaved", "neox")
"""The two RoPE layouts: adjacent pairs ``(2i, 2i+1)``, or halves ``(i, i + d/2)``."""


def check_layout(layout: str) -> str:
    """``layout`` if it is one of :data:`LAYOUTS`, else ValueError."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def _check_head_dim(head_dim: int) -> None:
    check_positive_int("head_dim", head_dim)
    if head_dim % 2:
        raise ValueError(f"RoPE rotates pairs of dimensions, so head_dim must be even, got {head_dim}")


def rope_frequencies(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """``theta_i = base^(-2i/d)`` for ``i = 0 .. d/2 - 1``, radians per token, float64 (RoFormer, section 3.2.2)."""
    _check_head_dim(head_dim)
    check_positive("base", base)
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype RMSNorm and RoPE compute in for inputs of ``dtype``: fp64 for fp64, else fp32.

    Plain Python, not ``torch.promote_types``: a torch function would show up among the operations that
    part 3's byte-counting labs trace.
    """
    return torch.float64 if dtype == torch.float64 else torch.float32


def to_compute_dtype(x: torch.Tensor) -> torch.Tensor:
    """``x`` in :func:`compute_dtype`: ``x.double()`` for fp64, else ``x.float()`` (no copy when already there;
    spelled as those two methods, so that traced graphs and profiles read as before fp64 was kept)."""
    return x.double() if x.dtype == torch.float64 else x.float()


def rope_angles(seq_len: int, head_dim: int, base: float = 10000.0, start: int = 0,
                device: torch.device | str | None = None,
                inv_freq: torch.Tensor | None = None,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of ``m * theta_i`` for positions ``start .. start + seq_len - 1``: shape ``(seq_len, head_dim/2)``,
    in ``dtype`` (fp32 by default) on ``device`` (the CPU by default). The angles are computed in fp64 on the CPU,
    then cast and moved.

    ``inv_freq`` (shape ``(head_dim/2,)``) replaces the default ``theta_i``, e.g. by a long-context scaling of
    :mod:`utils.attention.rope_scaling`. The tables serve both layouts: column ``i`` is pair ``i``'s angle.
    """
    if inv_freq is None:
        theta = rope_frequencies(head_dim, base)
    else:
        _check_head_dim(head_dim)
        if inv_freq.shape != (head_dim // 2,):
            raise ValueError(f"inv_freq must have shape ({head_dim // 2},), got {tuple(inv_freq.shape)}")
        theta = inv_freq.detach().to("cpu", torch.float64)
    positions = torch.arange(start, start + seq_len, dtype=torch.float64)
    angles = torch.outer(positions, theta)
    return angles.cos().to(dtype).to(device), angles.sin().to(dtype).to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "interleaved") -> torch.Tensor:
    """Rotate the pairs of the last dim of ``x`` (``(..., seq, head_dim)``) by the angles; computed in fp32 (fp64 for fp64).

    ``layout="interleaved"``: pair ``i`` is ``(x_{2i}, x_{2i+1})`` (Meta). ``"neox"``: ``(x_i, x_{i+d/2})``, which
    is Hugging Face's ``x * cos + rotate_half(x) * sin`` with ``cos``, ``sin`` repeated over both halves.
    """
    check_layout(layout)
    if x.shape[-1] % 2 or cos.shape[-1] * 2 != x.shape[-1]:
        raise ValueError(f"x's last dim must be even and twice cos's, got {tuple(x.shape)} and {tuple(cos.shape)}")
    xf = to_compute_dtype(x)
    if layout == "interleaved":
        pairs = xf.unflatten(-1, (-1, 2))
        first, second = pairs[..., 0], pairs[..., 1]
    else:
        first, second = xf.chunk(2, dim=-1)
    y_first, y_second = first * cos - second * sin, first * sin + second * cos
    if layout == "interleaved":
        return torch.stack((y_first, y_second), dim=-1).flatten(-2).to(x.dtype)
    return torch.cat((y_first, y_second), dim=-1).to(x.dtype)


def neox_permutation(head_dim: int) -> torch.Tensor:
    """``perm = [0, 2, ..., d-2, 1, 3, ..., d-1]``: ``x[..., perm]`` moves an interleaved vector to the NeoX layout.

    Pair ``i`` sits at ``(2i, 2i+1)`` before and at ``(i, i + d/2)`` after. The inverse is ``perm.argsort()``.
    """
    _check_head_dim(head_dim)
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


def permute_rows_to_neox(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The rows of a ``W_q`` or ``W_k`` (``(n_heads * head_dim, dim)``) reordered head by head by :func:`neox_permutation`.

    What Hugging Face's ``convert_llama_weights_to_hf.py`` does to Meta's checkpoints (``permute``): afterwards
    ``apply_rope(x @ W'.T, layout="neox")`` equals ``apply_rope(x @ W.T, layout="interleaved")`` with every
    head's dimensions permuted, so attention scores are unchanged.
    """
    check_positive_int("n_heads", n_heads)
    if weight.dim() != 2 or weight.shape[0] % n_heads:
        raise ValueError(f"weight must be 2-D with rows a multiple of n_heads ({n_heads}), got {tuple(weight.shape)}")
    head_dim = weight.shape[0] // n_heads
    perm = neox_permutation(head_dim).to(weight.device)
    return weight.view(n_heads, head_dim, -1)[:, perm].reshape(weight.shape)
