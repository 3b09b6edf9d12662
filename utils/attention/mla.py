"""Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, section 2.1), naive and absorbed.

With ``h_t`` the input of token ``t``, ``n_h`` heads of size ``d_h``, a KV
latent of ``d_c`` and a query latent of ``d_c'`` dimensions, and a decoupled
RoPE dimension ``d_h^R`` (equations 9-19 of the paper):

- keys and values come from one compressed latent, the only per-head-free
  thing to cache: ``c_KV = W_DKV h``, ``k^C = W_UK c_KV``, ``v^C = W_UV c_KV``;
- queries are compressed too (to save activation memory in training):
  ``c_Q = W_DQ h``, ``q^C = W_UQ c_Q``;
- RoPE is carried by extra dimensions: ``q^R = RoPE(W_QR c_Q)`` per head and
  one ``k^R = RoPE(W_KR h)`` shared by all heads, cached beside ``c_KV``;
- head ``i`` attends with ``[q^C_i; q^R_i] . [k^C_i; k^R]`` scaled by
  ``1/sqrt(d_h + d_h^R)`` and outputs ``sum_j p_ij v^C_{j,i}``; ``W_O`` mixes the heads.

*Absorption.* ``q^C_i . k^C_{j,i} = q^C_i . W_UK_i c_j = (W_UK_i^T q^C_i) . c_j``, so
``W_UK`` can move to the query side, and ``sum_j p_ij W_UV_i c_j = W_UV_i
sum_j p_ij c_j``, so ``W_UV`` can move after the attention. Attention then runs
over the cached latents directly, like MQA with one ``d_c + d_h^R``-wide head.
RoPE blocks the same trick for the rotated part: ``RoPE_m(q) . RoPE_n(W k)``
puts a position-dependent rotation between ``q`` and ``W``, so the product
cannot be folded into one fixed matrix; that is why the RoPE dimensions are
decoupled and kept uncompressed.

*As DeepSeek serves it.* The checkpoints add an RMSNorm after each compressed
latent (section 3.1.2: "additional RMS Norm layers after the compressed latent
vectors"), so what is cached is ``RMSNorm(W_DKV h)`` (vLLM's ``kv_c_normed``)
and the queries are rebuilt from ``RMSNorm(W_DQ h)``. The norm sits *before*
``W_UK`` and ``W_UV``, so absorption is untouched. :data:`WEIGHT_NAMES` maps the
paper's matrices to the names of the released weights (Hugging Face's
``modeling_deepseek.py`` and vLLM's ``deepseek_v2.py`` use the same ones), which
fuse some of them: ``q_b_proj`` is ``[W_UQ_i; W_QR_i]`` per head, ``kv_b_proj`` is
``[W_UK_i; W_UV_i]`` per head and ``kv_a_proj_with_mqa`` is ``[W_DKV; W_KR]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from utils.attention.llama import apply_rope, rope_angles
from utils.attention.rope import compute_dtype
from utils.validate import check_positive_int


WEIGHT_NAMES: dict[str, tuple[str, str]] = {
    "W_DQ": ("q_a_proj", "d_c' x d: compresses h to the query latent c_Q"),
    "RMSNorm(c_Q)": ("q_a_layernorm", "the norm on the query latent (section 3.1.2)"),
    "W_UQ, W_QR": ("q_b_proj", "n_h (d_h + d_h^R) x d_c': per head, [W_UQ_i; W_QR_i] stacked"),
    "W_DKV, W_KR": ("kv_a_proj_with_mqa", "(d_c + d_h^R) x d: c_KV and the shared RoPE key k^R"),
    "RMSNorm(c_KV)": ("kv_a_layernorm", "the norm on c_KV; its output is what is cached (kv_c_normed)"),
    "W_UK, W_UV": ("kv_b_proj", "n_h (d_h + d_h) x d_c: per head, [W_UK_i; W_UV_i] stacked"),
    "W_O": ("o_proj", "d x n_h d_h"),
}
"""The paper's matrices (DeepSeek-V2, equations 9-19) -> (name in the released checkpoints, shape and role).

Names as in Hugging Face's ``DeepseekV2Attention``/``DeepseekV3Attention`` and
vLLM's ``DeepseekV2MLAAttention``; vLLM's ``vllm/v1/attention/backends/mla/common.py``
spells out the fusions ("kv_b_proj is [W_UK; W_UV] concatenated per head").
"""


@dataclass(frozen=True)
class MLAConfig:
    """MLA sizes; DeepSeek-V2's are dim 5120, 128 heads, d_h 128, d_c 512, d_c' 1536, d_h^R 64."""

    dim: int = 64
    n_heads: int = 4
    head_dim: int = 16
    kv_lora_rank: int = 32
    q_lora_rank: int = 48
    rope_head_dim: int = 8

    def __post_init__(self) -> None:
        for name in ("dim", "n_heads", "head_dim", "kv_lora_rank", "q_lora_rank", "rope_head_dim"):
            check_positive_int(name, getattr(self, name))
        if self.rope_head_dim % 2:
            raise ValueError(f"rope_head_dim must be even (RoPE rotates pairs), got {self.rope_head_dim}")


class MLA(nn.Module):
    """Causal multi-head latent attention; ``forward`` is the naive form, ``forward_absorbed`` the cached one."""

    def __init__(self, config: MLAConfig) -> None:
        super().__init__()
        c = self.config = config
        nh, dh, dr = c.n_heads, c.head_dim, c.rope_head_dim
        self.w_dkv = nn.Linear(c.dim, c.kv_lora_rank, bias=False)
        self.w_uk = nn.Linear(c.kv_lora_rank, nh * dh, bias=False)
        self.w_uv = nn.Linear(c.kv_lora_rank, nh * dh, bias=False)
        self.w_dq = nn.Linear(c.dim, c.q_lora_rank, bias=False)
        self.w_uq = nn.Linear(c.q_lora_rank, nh * dh, bias=False)
        self.w_qr = nn.Linear(c.q_lora_rank, nh * dr, bias=False)
        self.w_kr = nn.Linear(c.dim, dr, bias=False)
        self.w_o = nn.Linear(nh * dh, c.dim, bias=False)
        # section 3.1.2: RMSNorm on both compressed latents (q_a_layernorm, kv_a_layernorm in the checkpoints)
        self.q_norm = nn.RMSNorm(c.q_lora_rank, eps=1e-6)
        self.kv_norm = nn.RMSNorm(c.kv_lora_rank, eps=1e-6)

    def _queries(self, h: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        c, (b, s, _) = self.config, h.shape
        c_q = self.q_norm(self.w_dq(h))
        q_c = self.w_uq(c_q).view(b, s, c.n_heads, c.head_dim).transpose(1, 2)
        cos, sin = rope_angles(s, c.rope_head_dim, start=start, device=h.device, dtype=compute_dtype(h.dtype))
        q_r = apply_rope(self.w_qr(c_q).view(b, s, c.n_heads, c.rope_head_dim).transpose(1, 2), cos, sin)
        return q_c, q_r

    def latents(self, h: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """What MLA caches per token: ``RMSNorm(c_KV)`` ``(b, s, d_c)`` and the shared RoPE key ``(b, s, d_h^R)``.

        The norm follows DeepSeek-V2 section 3.1.2 (vLLM calls its output
        ``kv_c_normed``); the RoPE key is not normed.
        """
        cos, sin = rope_angles(h.shape[1], self.config.rope_head_dim, start=start, device=h.device,
                               dtype=compute_dtype(h.dtype))
        return self.kv_norm(self.w_dkv(h)), apply_rope(self.w_kr(h), cos, sin)

    def _attend(self, scores: torch.Tensor, start: int) -> torch.Tensor:
        s, n_keys = scores.shape[-2:]
        future = torch.ones(s, n_keys, dtype=torch.bool, device=scores.device).triu(start + 1)
        scale = 1 / math.sqrt(self.config.head_dim + self.config.rope_head_dim)
        return (scores * scale).masked_fill(future, float("-inf")).softmax(-1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Naive MLA: rebuild every head's keys and values from ``c_KV``, then ordinary attention."""
        c, (b, s, _) = self.config, h.shape
        q_c, q_r = self._queries(h, 0)
        c_kv, k_r = self.latents(h)
        k_c = self.w_uk(c_kv).view(b, s, c.n_heads, c.head_dim).transpose(1, 2)
        v_c = self.w_uv(c_kv).view(b, s, c.n_heads, c.head_dim).transpose(1, 2)
        q = torch.cat([q_c, q_r], dim=-1)
        k = torch.cat([k_c, k_r[:, None].expand(b, c.n_heads, s, c.rope_head_dim)], dim=-1)
        out = self._attend(q @ k.transpose(-2, -1), 0) @ v_c
        return self.w_o(out.transpose(1, 2).reshape(b, s, -1))

    def forward_absorbed(self, h: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        """MLA with ``W_UK`` absorbed into the queries and ``W_UV`` applied after attention.

        Only ``c_KV`` and ``k^R`` are kept in ``cache`` (a dict this method
        fills), ``d_c + d_h^R`` numbers per token and layer.
        """
        c, (b, s, _) = self.config, h.shape
        start = cache["c_kv"].shape[1] if cache else 0
        q_c, q_r = self._queries(h, start)
        c_kv, k_r = self.latents(h, start)
        if cache is not None:
            if cache:
                c_kv, k_r = torch.cat([cache["c_kv"], c_kv], 1), torch.cat([cache["k_r"], k_r], 1)
            cache["c_kv"], cache["k_r"] = c_kv, k_r
        w_uk = self.w_uk.weight.view(c.n_heads, c.head_dim, c.kv_lora_rank)
        q_latent = q_c @ w_uk  # (b, heads, s, d_c): W_UK_i^T q^C_i
        scores = q_latent @ c_kv[:, None].transpose(-2, -1) + q_r @ k_r[:, None].transpose(-2, -1)
        mixed = self._attend(scores, start) @ c_kv[:, None]  # (b, heads, s, d_c)
        w_uv = self.w_uv.weight.view(c.n_heads, c.head_dim, c.kv_lora_rank)
        out = mixed @ w_uv.transpose(-2, -1)  # W_UV_i (sum_j p_ij c_j)
        return self.w_o(out.transpose(1, 2).reshape(b, s, -1))
