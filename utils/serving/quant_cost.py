"""What quantisation does to one decode step on the roofline: bytes per token and the tokens/s bound.

A decode step of ``batch`` sequences with ``context`` cached tokens each reads the weights once,
``N * b_w`` bytes, and every sequence's KV cache, ``2 L H_kv d S * b_kv`` bytes each
(:mod:`utils.attention.decode_cost`, whose FLOPs this module reuses unchanged: quantisation changes the
bytes, not the arithmetic). Per generated token that is

    bytes / token = N b_w / batch + 2 L H_kv d S b_kv

so the weights' share shrinks with the batch while the cache's does not: at small batch weight quantisation
pays, at long context and large batch the KV cache's format does. The bound on throughput is
``batch / max(FLOPs / peak, bytes / bandwidth)`` (:func:`utils.gpu.roofline.min_seconds`). Weight-only
schemes dequantise to 16 bits and multiply on the fp16 Tensor Cores; W8A8 in FP8 multiplies on the FP8
Tensor Cores, whose dense peak is twice fp16's on an H100 (:mod:`utils.gpu.hardware`).
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from utils.attention.decode_cost import decode_step_cost, param_count, params_read_per_step
from utils.attention.kv_cache import MODELS, cached_tokens, kv_cache_bytes
from utils.gpu import hardware
from utils.gpu.roofline import OpCost, min_seconds
from utils.serving.quant import bytes_per_weight, kv_bytes_per_element
from utils.validate import check_nonnegative_int, check_positive, check_positive_int

__all__ = ["SCHEMES", "Scheme", "decode_bound", "plot_decode_bound", "quantised_decode_cost", "scheme_bytes"]


@dataclass(frozen=True)
class Scheme:
    """A serving format: weight bits (16, 8 or 4, with ``group_size``), KV cache format, and the matmul precision."""

    weight_bits: int = 16
    group_size: int = 128
    kv: str = "fp16"
    """``"fp16"``, ``"int8"`` (per-vector fp32 scales) or ``"fp8_e4m3"`` (per-tensor scale)."""
    precision: str = "fp16"
    """The Tensor Core precision of the matmuls: ``"fp16"`` for weight-only, ``"fp8"`` for FP8 W8A8."""


SCHEMES = {
    "fp16": Scheme(),
    "int8 weights": Scheme(weight_bits=8),
    "int4 weights, g128": Scheme(weight_bits=4),
    "FP8 W8A8 + FP8 KV": Scheme(weight_bits=8, group_size=0, kv="fp8_e4m3", precision="fp8"),
    "int4 weights + int8 KV": Scheme(weight_bits=4, kv="int8"),
}
"""The formats this part compares. ``group_size=0`` marks per-tensor scales (their bytes are negligible)."""


def scheme_bytes(scheme: Scheme, head_dim: int) -> tuple[float, float]:
    """``(bytes per weight, bytes per KV element)`` of ``scheme``, scales and zero points included."""
    if scheme.weight_bits == 16:
        weight = 2.0
    elif scheme.group_size == 0:
        weight = scheme.weight_bits / 8
    else:
        weight = bytes_per_weight(scheme.weight_bits, scheme.group_size)
    kv = 2.0 if scheme.kv == "fp16" else kv_bytes_per_element(scheme.kv, head_dim)
    return weight, kv


def quantised_decode_cost(model: str, batch: int, context: int, weight_bytes: float = 2.0,
                          kv_bytes: float = 2.0) -> OpCost:
    """FLOPs and HBM bytes of one decode step of ``model`` (a :data:`utils.attention.kv_cache.MODELS` name).

    FLOPs as :func:`utils.attention.decode_cost.decode_step_cost`; bytes
    ``N weight_bytes + 2 L H_kv d S kv_bytes batch`` with ``N`` the parameters a step reads.
    """
    check_positive_int("batch", batch)
    check_nonnegative_int("context", context)
    check_positive("weight_bytes", weight_bytes, finite=True)
    check_positive("kv_bytes", kv_bytes, finite=True)
    n_params, config = params_read_per_step(model), MODELS[model]
    flops = decode_step_cost(n_params, config, batch, context).flops
    cache_elements = kv_cache_bytes(config.n_layers, config.n_kv_heads, config.head_dim,
                                    cached_tokens(context, config.sliding_window), batch, 1) if context else 0
    return OpCost(flops, n_params * weight_bytes + cache_elements * kv_bytes)


def decode_bound(model: str, scheme: Scheme, batch: int, context: int, gpu: str = "H100-SXM"
                 ) -> dict[str, float]:
    """The roofline of one decode step in ``scheme``: bytes per token (weights, KV), intensity, tokens/s bound.

    ``"memory (GB)"`` is what must sit in HBM: all the parameters in the scheme's weight format and the
    ``batch`` caches of ``context`` tokens (activations left out).
    """
    weight, kv = scheme_bytes(scheme, MODELS[model].head_dim)
    cost = quantised_decode_cost(model, batch, context, weight, kv)
    weights_per_token = params_read_per_step(model) * weight / batch
    return {"weight bytes/token": weights_per_token, "kv bytes/token": cost.nbytes / batch - weights_per_token,
            "intensity": cost.intensity,
            "tokens/s": batch / min_seconds(cost, gpu, scheme.precision),
            "memory (GB)": (param_count(model) * weight + cost.nbytes - params_read_per_step(model) * weight) / 1e9}


def plot_decode_bound(model: str = "Llama-3-8B", context: int = 4096, gpu: str = "H100-SXM",
                      max_batch: int = 256) -> Figure:
    """Bytes per generated token (left) and the tokens/s bound (right) against batch, one line per scheme.

    A scheme's line stops at the largest batch whose weights and caches fit in the GPU's memory.
    """
    check_positive_int("max_batch", max_batch)
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    batches = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if b <= max_batch]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 3.6))
    hbm_gb = hardware.spec(gpu).hbm_bytes / 1e9
    for (name, scheme), color in zip(SCHEMES.items(), plt.cm.tab10.colors):
        rows = [(b, decode_bound(model, scheme, b, context, gpu)) for b in batches]
        rows = [(b, r) for b, r in rows if r["memory (GB)"] <= hbm_gb]  # only batches whose caches fit
        if not rows:
            continue
        xs = [b for b, _ in rows]
        left.plot(xs, [(r["weight bytes/token"] + r["kv bytes/token"]) / 1e6 for _, r in rows], "o-",
                  color=color, label=name, ms=3)
        right.plot(xs, [r["tokens/s"] for _, r in rows], "o-", color=color, label=name, ms=3)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch (sequences decoding together)")
        ax.grid(alpha=0.3, which="both")
    left.set(ylabel="HBM bytes per generated token (MB)", title=f"{model}, {context:,}-token context")
    right.set(ylabel="tokens/s bound", title=f"roofline bound, one {gpu} (batches that fit in {hbm_gb:.0f} GB)")
    left.legend(fontsize=7)
    fig.tight_layout()
    return fig
