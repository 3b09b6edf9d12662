"""How many parameters a LLaMA-style decoder has, and LLaMA-1's published sizes to check the count against.

For vocabulary ``V``, width ``d``, ``L`` layers, SwiGLU hidden size ``h``, and
``n_kv_heads`` of ``n_heads`` key/value heads (head size ``d / n_heads``):

- embedding and (untied) output projection: ``2 V d``;
- attention per layer: ``W_q`` and ``W_o`` are ``d x d``, ``W_k`` and ``W_v``
  are ``d x (n_kv_heads * d / n_heads)``: ``2 d^2 + 2 d^2 n_kv_heads / n_heads``;
- SwiGLU per layer: ``W_1``, ``W_3`` (``d x h``) and ``W_2`` (``h x d``): ``3 d h``;
- RMSNorm gains: two per layer and one final, ``d`` each (no biases anywhere).

LLaMA-1's sizes are Table 2 of Touvron et al. 2023 (arXiv:2302.13971); the
vocabulary of 32000 and the FFN sizes (11008 for the 7B model) are those of the
released checkpoints' ``config.json`` (``vocab_size``, ``intermediate_size``),
which :func:`utils.attention.llama.swiglu_hidden_size` reproduces from ``d``.
"""

from __future__ import annotations

from dataclasses import dataclass

from utils.attention.llama import swiglu_hidden_size
from utils.published import Published
from utils.validate import check_positive_int

_LLAMA = "Touvron et al., 'LLaMA: Open and Efficient Foundation Language Models', arXiv:2302.13971, Table 2"
LLAMA_VOCAB = 32000
"""LLaMA-1's vocabulary (``vocab_size`` of the released checkpoints' config.json, e.g. huggyllama/llama-7b)."""


@dataclass(frozen=True)
class LlamaSize:
    """One row of the LLaMA paper's Table 2: width, heads, layers, and the published parameter count."""

    name: str
    dim: int
    n_heads: int
    n_layers: int
    params: Published


LLAMA_1 = (
    LlamaSize("LLaMA-7B", 4096, 32, 32, Published(6.7e9, "parameters", _LLAMA)),
    LlamaSize("LLaMA-13B", 5120, 40, 40, Published(13.0e9, "parameters", _LLAMA)),
    LlamaSize("LLaMA-33B", 6656, 52, 60, Published(32.5e9, "parameters", _LLAMA)),
    LlamaSize("LLaMA-65B", 8192, 64, 80, Published(65.2e9, "parameters", _LLAMA)),
)
"""LLaMA-1 as published; the FFN size follows from ``dim`` (2/3 * 4d rounded up to a multiple of 256)."""


def llama_param_breakdown(dim: int, n_layers: int, vocab: int = LLAMA_VOCAB, hidden: int | None = None,
                          n_heads: int = 1, n_kv_heads: int | None = None) -> dict[str, int]:
    """Parameters of a LLaMA-style decoder by kind (see the module docstring for each formula).

    ``hidden`` defaults to :func:`swiglu_hidden_size` ``(dim)``; ``n_kv_heads`` to ``n_heads`` (MHA).
    Keys: ``embedding``, ``attention``, ``ffn``, ``norms``, ``output``; every layer summed.
    """
    for name, value in (("dim", dim), ("n_layers", n_layers), ("vocab", vocab), ("n_heads", n_heads)):
        check_positive_int(name, value)
    hidden = swiglu_hidden_size(dim) if hidden is None else hidden
    check_positive_int("hidden", hidden)
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    check_positive_int("n_kv_heads", n_kv_heads)
    if dim % n_heads or n_heads % n_kv_heads:
        raise ValueError(f"dim ({dim}) must be a multiple of n_heads ({n_heads}), and n_heads of "
                         f"n_kv_heads ({n_kv_heads})")
    kv_dim = n_kv_heads * (dim // n_heads)
    return {
        "embedding": vocab * dim,
        "attention": n_layers * (2 * dim * dim + 2 * dim * kv_dim),
        "ffn": n_layers * 3 * dim * hidden,
        "norms": (2 * n_layers + 1) * dim,
        "output": vocab * dim,
    }


def llama_param_count(dim: int, n_layers: int, vocab: int = LLAMA_VOCAB, hidden: int | None = None,
                      n_heads: int = 1, n_kv_heads: int | None = None) -> int:
    """Total parameters of a LLaMA-style decoder: the sum of :func:`llama_param_breakdown`."""
    return sum(llama_param_breakdown(dim, n_layers, vocab, hidden, n_heads, n_kv_heads).values())
