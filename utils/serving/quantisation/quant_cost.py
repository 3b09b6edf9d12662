"""What quantisation does to one decode step on the roofline: bytes per token and the tokens/s bound.

A decode step of ``batch`` sequences with ``context`` cached tokens each reads the weights once,
``N * b_w`` bytes, and every sequence's KV cache, ``2 L H_kv d S * b_kv`` bytes each; its FLOPs,
``2 N`` per token for the weight matmuls and ``4 L H d S`` for attention, do not depend on the storage
format (quantisation changes the bytes, not the arithmetic). Per generated token that is

    bytes / token = N b_w / batch + 2 L H_kv d S b_kv

so the weights' share shrinks with the batch while the cache's does not: at small batch weight quantisation
pays, at long context and large batch the KV cache's format does. The step is priced with part 5's one step
model (:mod:`utils.serving.costs.step_time`, chapter 1): the weight matmuls and attention over the caches run as
separate kernels, each on its own roofline,

    t = max(2 N B / P, N b_w / W) + max(4 L H d S B / P, 2 L H_kv d S b_kv B / W),

and the bound on throughput is ``batch / t``. So once the weight matmuls turn compute-bound (``2 B / b_w``
FLOPs per byte past the ridge ``P / W``), smaller weights no longer shorten them, however many bytes the
caches add. Weight-only schemes dequantise to 16 bits and multiply on the fp16 Tensor Cores; W8A8 in FP8
multiplies on the FP8 Tensor Cores, whose dense peak is twice fp16's on an H100 (:mod:`utils.gpu.hardware`).
The step's one roof ``P`` is that precision's (attention, far below either ridge, is bound by its bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from utils.attention.decode_cost import FFN_AND_VOCAB
from utils.attention.kv_cache import MODELS, cached_tokens
from utils.gpu import hardware
from utils.serving.quantisation.quant import bytes_per_weight, kv_bytes_per_element
from utils.serving.costs.step_time import Roof, ServedModel, StepCost, served_model, step_cost, step_seconds
from utils.validate import check_nonnegative_int, check_positive, check_positive_int

__all__ = ["SCHEMES", "Scheme", "decode_bound", "plot_decode_bound", "quantised_decode_cost", "quantised_model",
           "scheme_bytes"]


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


def quantised_model(model: str, weight_bytes: float = 2.0, kv_bytes: float = 2.0) -> ServedModel:
    """Chapter 1's :class:`~utils.serving.costs.step_time.ServedModel` of ``model`` with ``weight_bytes`` per weight
    and ``kv_bytes`` per cache element (scales included, :func:`scheme_bytes`).

    :func:`utils.serving.costs.step_time.served_model` with the weights' bytes scaled and the cache's bytes per
    token ``2 L H_kv d kv_bytes``; the FLOPs per token and per attended pair are the 16-bit model's.
    """
    check_positive("kv_bytes", kv_bytes, finite=True)
    elements = served_model(model, weight_bytes, kv_bytes_per_elem=1)  # cache bytes at 1 byte = elements
    return replace(elements, kv_bytes_per_token=elements.kv_bytes_per_token * kv_bytes)


def quantised_decode_cost(model: str, batch: int, context: int, weight_bytes: float = 2.0,
                          kv_bytes: float = 2.0) -> StepCost:
    """FLOPs and HBM bytes of one decode step of ``model`` (a :data:`utils.attention.decode_cost.FFN_AND_VOCAB`
    name), split into the weight matmuls and attention (:func:`utils.serving.costs.step_time.step_cost`).

    Weight matmuls: ``2 N batch`` FLOPs over ``N weight_bytes`` bytes, ``N`` the parameters a step reads;
    attention: ``4 L H d S batch`` FLOPs over ``2 L H_kv d S kv_bytes batch`` bytes. A model with a sliding
    window ``W`` (Mistral-7B) attends to, and keeps, ``S = min(context, W)`` tokens.
    """
    check_positive_int("batch", batch)
    check_nonnegative_int("context", context)
    served = quantised_model(model, weight_bytes, kv_bytes)
    attended = cached_tokens(context, MODELS[model].sliding_window) if context else 0
    return step_cost(served, [attended] * batch)


def decode_bound(model: str, scheme: Scheme, batch: int, context: int, gpu: str = "H100-SXM"
                 ) -> dict[str, float]:
    """The roofline of one decode step in ``scheme``: bytes per token (weights, KV), each part's FLOPs per byte,
    the tokens/s bound and the memory it needs.

    ``"tokens/s"`` is ``batch / t`` with ``t = max(F_w/P, B_w/W) + max(F_a/P, B_a/W)``
    (:func:`utils.serving.costs.step_time.step_seconds`, weight matmuls and attention as separate kernels) on
    ``gpu``'s roof in ``scheme.precision``. ``"memory (GB)"`` is what must sit in HBM: all the parameters in
    the scheme's weight format and the ``batch`` caches of ``context`` tokens (activations left out).
    """
    if model not in FFN_AND_VOCAB:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(FFN_AND_VOCAB)}")
    weight, kv = scheme_bytes(scheme, MODELS[model].head_dim)
    cost = quantised_decode_cost(model, batch, context, weight, kv)
    resident = quantised_model(model, weight, kv).resident_bytes
    return {"weight bytes/token": cost.linear.nbytes / batch, "kv bytes/token": cost.attention.nbytes / batch,
            "weights FLOPs/byte": cost.linear.intensity,
            "attention FLOPs/byte": cost.attention.intensity if cost.attention.nbytes else 0.0,
            "tokens/s": batch / step_seconds(cost, Roof.of(gpu, scheme.precision)),
            "memory (GB)": (resident + cost.attention.nbytes) / 1e9}


def plot_decode_bound(model: str = "Llama-3-8B", context: int = 4096, gpu: str = "H100-SXM",
                      max_batch: int = 256) -> Figure:
    """Bytes per generated token (left) and the tokens/s bound (right) against batch, one line per scheme.

    A scheme's line stops at the largest batch whose weights and caches fit in the GPU's memory.
    """
    check_positive_int("max_batch", max_batch)
    if model not in FFN_AND_VOCAB:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(FFN_AND_VOCAB)}")
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
    right.set(ylabel="tokens/s bound (matmuls + attention)", title=f"one {gpu}, batches that fit in {hbm_gb:.0f} GB")
    left.legend(fontsize=7)
    fig.tight_layout()
    return fig
