"""Parameters of a mixture-of-experts model against the parameters (and FLOPs) each token activates.

An MoE transformer stores every expert but runs only the ``k`` routed experts
a token picks, plus the shared experts and everything that is not an expert
(attention, norms, router, embeddings). So

    total     = embeddings + sum over layers (attention + norms + FFN of the layer),
    activated = the same with each MoE layer's routed experts counted ``k`` times, not ``E`` times,

with a SwiGLU expert of ``3 h f`` parameters and the router's ``h E`` (plus ``E``
bias terms for DeepSeek-V3's selection bias). The forward pass costs about
``2 * activated`` FLOPs per token (one multiply-add per weight; the input
embedding is a lookup and costs none; attention's score FLOPs, which grow with
the context, are left out), training about three times that
(:func:`utils.parallel.training.training_flops`).

:data:`MODELS` holds Mixtral 8x7B and DeepSeek-V3 from their released
configurations; :data:`PUBLISHED` their stated sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from utils.published import Published
from utils.validate import check_nonnegative_int, check_positive_int


def gqa_attention_params(hidden: int, n_heads: int, n_kv_heads: int, head_dim: int) -> int:
    """Bias-free attention with grouped KV heads: ``W_q, W_o`` of ``h n_heads d`` each, ``W_k, W_v`` of ``h n_kv d``."""
    for name, value in (("hidden", hidden), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim)):
        check_positive_int(name, value)
    return 2 * hidden * n_heads * head_dim + 2 * hidden * n_kv_heads * head_dim


def mla_attention_params(hidden: int, n_heads: int, q_lora_rank: int, kv_lora_rank: int, qk_nope_head_dim: int,
                         qk_rope_head_dim: int, v_head_dim: int) -> int:
    """Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, §2.1), its low-rank projections and their norms.

    ``W_DQ`` (h x d_q'), ``W_UQ`` with the RoPE queries (d_q' x n (d_nope + d_rope)),
    ``W_DKV`` with the shared RoPE key (h x (d_c + d_rope)), ``W_UK, W_UV``
    (d_c x n (d_nope + d_v)), ``W_O`` (n d_v x h), and the two RMSNorms on the latents.
    """
    for name, value in (("hidden", hidden), ("n_heads", n_heads), ("q_lora_rank", q_lora_rank),
                        ("kv_lora_rank", kv_lora_rank), ("qk_nope_head_dim", qk_nope_head_dim),
                        ("qk_rope_head_dim", qk_rope_head_dim), ("v_head_dim", v_head_dim)):
        check_positive_int(name, value)
    q = hidden * q_lora_rank + q_lora_rank + q_lora_rank * n_heads * (qk_nope_head_dim + qk_rope_head_dim)
    kv = hidden * (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank
    kv += kv_lora_rank * n_heads * (qk_nope_head_dim + v_head_dim)
    return q + kv + n_heads * v_head_dim * hidden


@dataclass(frozen=True)
class MoEModel:
    """A decoder-only MoE transformer: ``n_dense_layers`` with a dense FFN of width ``dense_ffn``, the rest MoE.

    Each MoE layer has ``n_routed`` experts (``top_k`` per token) and ``n_shared``
    always-on experts, all SwiGLU of width ``expert_ffn``; ``router_bias`` adds
    DeepSeek-V3's ``E`` selection-bias terms. Each layer has two RMSNorms of
    ``hidden``, the model a final one; ``tied`` embeddings share input and output.
    """

    hidden: int
    n_layers: int
    vocab: int
    attention_params: int
    n_routed: int
    top_k: int
    expert_ffn: int
    n_shared: int = 0
    n_dense_layers: int = 0
    dense_ffn: int = 0
    router_bias: bool = False
    tied: bool = False

    def __post_init__(self) -> None:
        for name in ("hidden", "n_layers", "vocab", "attention_params", "n_routed", "top_k", "expert_ffn"):
            check_positive_int(name, getattr(self, name))
        for name in ("n_shared", "n_dense_layers", "dense_ffn"):
            check_nonnegative_int(name, getattr(self, name))
        if self.top_k > self.n_routed:
            raise ValueError(f"top_k must be at most n_routed={self.n_routed}, got {self.top_k}")
        if self.n_dense_layers > self.n_layers:
            raise ValueError(f"n_dense_layers must be at most n_layers={self.n_layers}, got {self.n_dense_layers}")
        if self.n_dense_layers and not self.dense_ffn:
            raise ValueError("dense_ffn must be positive when there are dense layers")


def moe_param_counts(model: MoEModel) -> dict[str, int]:
    """``{"total", "activated", "embedding", "routed_experts"}`` parameters of ``model``.

    ``activated`` counts each MoE layer's routed experts ``top_k`` times and
    includes both embedding matrices (as Mixtral's and DeepSeek-V3's stated
    sizes do); ``embedding`` is the input embedding alone (a lookup, no FLOPs).
    """
    h, moe_layers = model.hidden, model.n_layers - model.n_dense_layers
    expert = 3 * h * model.expert_ffn
    embedding = model.vocab * h
    common = (embedding * (1 if model.tied else 2) + h
              + model.n_layers * (model.attention_params + 2 * h)
              + model.n_dense_layers * 3 * h * model.dense_ffn
              + moe_layers * (model.n_shared * expert + h * model.n_routed + model.n_routed * model.router_bias))
    return {"total": common + moe_layers * model.n_routed * expert,
            "activated": common + moe_layers * model.top_k * expert,
            "embedding": embedding,
            "routed_experts": moe_layers * model.n_routed * expert}


def forward_flops_per_token(model: MoEModel) -> float:
    """About ``2 * (activated - input embedding)``: one multiply-add per activated weight, attention scores excluded."""
    counts = moe_param_counts(model)
    return 2.0 * (counts["activated"] - (0 if model.tied else counts["embedding"]))


MODELS: Mapping[str, MoEModel] = MappingProxyType({
    # mistralai/Mixtral-8x7B-v0.1 config.json: hidden 4096, 32 layers, 32 heads, 8 KV heads, FFN 14336, vocab 32000.
    "Mixtral 8x7B": MoEModel(hidden=4096, n_layers=32, vocab=32000, attention_params=gqa_attention_params(4096, 32, 8, 128),
                             n_routed=8, top_k=2, expert_ffn=14336),
    # deepseek-ai/DeepSeek-V3 config.json: 61 layers (first 3 dense, FFN 18432), 1 shared + 256 routed experts
    # of width 2048, 8 routed per token, MLA with 128 heads, vocab 129280 (the main model, without its MTP module).
    "DeepSeek-V3": MoEModel(hidden=7168, n_layers=61, vocab=129280,
                            attention_params=mla_attention_params(7168, 128, 1536, 512, 128, 64, 128),
                            n_routed=256, top_k=8, expert_ffn=2048, n_shared=1, n_dense_layers=3, dense_ffn=18432,
                            router_bias=True),
})
"""Two MoE models from their released Hugging Face configurations."""

_MIXTRAL_BLOG = "Mistral AI, 'Mixtral of experts' (mistral.ai/news/mixtral-of-experts, 11 Dec 2023)"
_DSV3 = "DeepSeek-AI, DeepSeek-V3 Technical Report, arXiv:2412.19437"

PUBLISHED: Mapping[str, Published] = MappingProxyType({
    "mixtral_total_params": Published(46.7e9, "parameters", _MIXTRAL_BLOG + " (the paper, arXiv:2401.04088, §2: 47B)"),
    "mixtral_active_params": Published(12.9e9, "parameters per token",
                                       _MIXTRAL_BLOG + " (the paper, arXiv:2401.04088, §2: 13B)"),
    "deepseek_v3_total_params": Published(671e9, "parameters", _DSV3 + ", abstract and §2 (main model, MTP excluded)"),
    "deepseek_v3_activated_params": Published(37e9, "parameters per token", _DSV3 + ", abstract and §4.2"),
})
"""Stated sizes of the models in :data:`MODELS`."""
