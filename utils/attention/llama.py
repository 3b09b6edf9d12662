"""A LLaMA-style decoder from its parts: RMSNorm, SwiGLU, RoPE and grouped-query attention with a KV cache.

The parts, each with its source:

- RMSNorm (Zhang & Sennrich 2019, arXiv:1910.07467):
  ``y = x / sqrt(mean(x^2) + eps) * g``, no mean subtraction and no bias.
- SwiGLU (Shazeer 2020, arXiv:2002.05202): ``W_2 (SiLU(W_1 x) * W_3 x)``; to keep
  the parameter count of a ``4d`` GELU MLP, the hidden size is ``2/3 * 4d``
  (LLaMA rounds it up to a multiple of 256: Touvron et al. 2023,
  arXiv:2302.13971, section 2.2).
- RoPE (Su et al. 2021, arXiv:2104.09864): rotate each pair of query and key
  dimensions ``(x_{2i}, x_{2i+1})`` by the angle ``m * theta_i`` at position
  ``m``, ``theta_i = base^(-2i/d)``, so that ``q_m . k_n`` depends on ``m - n``
  only. Pairs are adjacent dimensions here (the paper's form; Hugging Face's
  LLaMA pairs dimension ``i`` with ``i + d/2``, the same rotation after a
  permutation of dimensions).
- Grouped-query attention (Ainslie et al. 2023, arXiv:2305.13245):
  ``n_kv_heads`` key/value heads, each shared by ``n_heads / n_kv_heads``
  query heads; ``n_kv_heads = n_heads`` is MHA, ``1`` is MQA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from utils.attention.rope import apply_rope, check_layout, compute_dtype, rope_angles, to_compute_dtype
from utils.validate import check_positive_int

__all__ = ["Attention", "Block", "LlamaConfig", "TinyLlama", "apply_rope", "rms_norm", "rope_angles",
           "swiglu_hidden_size"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(mean(x^2, last dim) + eps) * weight``, computed in fp32 (fp64 for fp64) and returned in ``x``'s dtype."""
    xc = to_compute_dtype(x)
    return (xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def swiglu_hidden_size(dim: int, multiple_of: int = 256) -> int:
    """LLaMA's SwiGLU hidden size: ``2/3 * 4 * dim``, rounded up to a multiple of ``multiple_of``.

    LLaMA-7B: ``dim = 4096`` gives 11008 (its published FFN size).
    """
    check_positive_int("dim", dim)
    check_positive_int("multiple_of", multiple_of)
    hidden = int(2 * 4 * dim / 3)
    return multiple_of * math.ceil(hidden / multiple_of)


@dataclass(frozen=True)
class LlamaConfig:
    """Sizes of a LLaMA-style decoder; ``ffn_hidden`` defaults to :func:`swiglu_hidden_size`.

    ``rope_layout`` is ``"interleaved"`` (Meta's checkpoints) or ``"neox"`` (Hugging Face's).
    """

    vocab: int = 256
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 4
    ffn_hidden: int | None = None
    rope_base: float = 10000.0
    eps: float = 1e-6
    rope_layout: str = "interleaved"

    def __post_init__(self) -> None:
        for name in ("vocab", "dim", "n_layers", "n_heads", "n_kv_heads"):
            check_positive_int(name, getattr(self, name))
        if self.dim % self.n_heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        check_layout(self.rope_layout)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def hidden(self) -> int:
        return self.ffn_hidden or swiglu_hidden_size(self.dim)


class Attention(nn.Module):
    """Causal grouped-query attention with RoPE and an optional KV cache (a dict this module fills)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        d, hd = config.dim, config.head_dim
        self.wq = nn.Linear(d, config.n_heads * hd, bias=False)
        self.wk = nn.Linear(d, config.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(d, config.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(config.n_heads * hd, d, bias=False)

    def forward(self, x: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        c, (b, s, _) = self.config, x.shape
        start = cache["k"].shape[2] if cache else 0
        # heads counted from the projections, not the config: under tensor parallelism a rank holds a share of them
        q = self.wq(x).view(b, s, -1, c.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, c.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, c.head_dim).transpose(1, 2)
        cos, sin = rope_angles(s, c.head_dim, c.rope_base, start, device=x.device, dtype=compute_dtype(x.dtype))
        q, k = apply_rope(q, cos, sin, c.rope_layout), apply_rope(k, cos, sin, c.rope_layout)
        if cache is not None:
            if cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(c.head_dim)
        # query i (absolute position start + i) sees keys 0 .. start + i
        future = torch.ones(s, k.shape[2], dtype=torch.bool, device=x.device).triu(start + 1)
        out = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    """Pre-norm decoder block: ``h = x + attn(rms(x))``, ``out = h + W_2(SiLU(W_1 rms(h)) * W_3 rms(h))``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.attn_norm = nn.Parameter(torch.ones(config.dim))
        self.attn = Attention(config)
        self.ffn_norm = nn.Parameter(torch.ones(config.dim))
        self.w1 = nn.Linear(config.dim, config.hidden, bias=False)
        self.w3 = nn.Linear(config.dim, config.hidden, bias=False)
        self.w2 = nn.Linear(config.hidden, config.dim, bias=False)

    def forward(self, x: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        h = x + self.attn(rms_norm(x, self.attn_norm, self.config.eps), cache)
        n = rms_norm(h, self.ffn_norm, self.config.eps)
        return h + self.w2(F.silu(self.w1(n)) * self.w3(n))


class TinyLlama(nn.Module):
    """Embedding, ``n_layers`` blocks, a final RMSNorm and an untied output projection."""

    def __init__(self, config: LlamaConfig = LlamaConfig()) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab, config.dim)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.Parameter(torch.ones(config.dim))
        self.out = nn.Linear(config.dim, config.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, caches: list[dict] | None = None) -> torch.Tensor:
        """Logits ``(batch, seq, vocab)``; with ``caches`` (one dict per layer) keys and values are kept."""
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            x = block(x, caches[i] if caches is not None else None)
        return self.out(rms_norm(x, self.norm, self.config.eps))

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, n_new: int, use_cache: bool = True) -> torch.Tensor:
        """Greedy decoding of ``n_new`` tokens after ``prompt`` (``(batch, seq)``), with or without a KV cache."""
        check_positive_int("n_new", n_new)
        tokens = prompt
        caches = [{} for _ in self.blocks] if use_cache else None
        step_input = prompt
        for _ in range(n_new):
            logits = self(step_input if use_cache else tokens, caches)
            next_token = logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, next_token], dim=1)
            step_input = next_token
        return tokens
