"""Why decoding is memory-bound: a roofline model of one decode step of a LLaMA-style model.

One decode step runs the model on one new token for each of ``batch``
sequences that already have ``context`` tokens cached. Let ``N`` be the
parameters a step reads: every weight matrix, i.e. all parameters but the
input embedding table, of which a step reads only ``batch`` rows
(:func:`params_read_per_step`). With ``b`` bytes per element:

- FLOPs: ``2 N`` per token for the matmuls, two per multiply-add (Kaplan et
  al., "Scaling Laws for Neural Language Models", arXiv:2001.08361, Table 1:
  a forward pass costs ``2N`` FLOPs per token, embedding excluded), plus
  attention over the cache, ``4 L H d S`` per token (``q K^T`` and ``P V``);
- bytes: the weights, ``N b``, read **once per step for the whole batch**,
  plus each sequence's own KV cache, ``2 L H_kv d S b``
  (:func:`utils.attention.kv_cache.kv_cache_bytes`), read once per step.

The step takes at least ``max(FLOPs / peak, bytes / bandwidth)``
(:func:`utils.gpu.roofline.min_seconds`), and serves ``batch`` tokens. Its
arithmetic intensity grows with the batch while the weights dominate the bytes
(about ``batch * 2 / b`` FLOPs per byte) and levels off as the caches take
over: their own work runs at ``2 H / (H_kv b)`` FLOPs per byte (``H / H_kv``
in fp16, 1 for MHA), the limit when they dominate both FLOPs and bytes.
Activations, kernel launches and communication are left out.
"""

from __future__ import annotations

from utils.attention.kv_cache import MODELS, AttentionConfig, cached_tokens, kv_cache_bytes
from utils.attention.llama_sizes import llama_param_count
from utils.gpu import hardware
from utils.gpu.roofline import OpCost, min_seconds
from utils.validate import check_nonnegative_int, check_positive, check_positive_int


FFN_AND_VOCAB = {"LLaMA-2-7B": (11008, 32000), "Llama-3-8B": (14336, 128256), "Mistral-7B": (14336, 32000),
                 "LLaMA-2-70B": (28672, 32000), "Llama-3-70B": (28672, 128256)}
"""``intermediate_size`` and ``vocab_size`` of the LLaMA-style models of :data:`utils.attention.kv_cache.MODELS`,
from the same ``config.json`` files (untied embeddings). The 7-8B totals are the published parameter
counts, 6,738,415,616, 8,030,261,248 and 7,241,732,096 (tests/attention/test_decode_cost.py); part 4's
RLHF cost model (:mod:`utils.rl.rlhf_cost`) uses the 70B rows too."""

SINGLE_GPU_MODELS = ("LLaMA-2-7B", "Llama-3-8B", "Mistral-7B")
"""The models whose fp16 weights fit on one 80 GB GPU: the ones the serving chapter serves on one H100."""


def param_count(model: str) -> int:
    """All parameters of ``model`` (one of :data:`FFN_AND_VOCAB`): what sits in GPU memory."""
    if model not in FFN_AND_VOCAB:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(FFN_AND_VOCAB)}")
    c = MODELS[model]
    if c.n_heads * c.head_dim != c.hidden:
        raise ValueError(f"{model}: heads x head_dim ({c.n_heads} x {c.head_dim}) must equal the hidden size")
    intermediate, vocab = FFN_AND_VOCAB[model]
    return llama_param_count(c.hidden, c.n_layers, vocab, intermediate, c.n_heads, c.n_kv_heads)


def params_read_per_step(model: str) -> int:
    """Parameters one decode step reads in full: all but the input embedding table (``vocab x hidden``)."""
    return param_count(model) - FFN_AND_VOCAB[model][1] * MODELS[model].hidden


def decode_step_cost(n_params: float, config: AttentionConfig, batch: int, context: int,
                     bytes_per_elem: int = 2) -> OpCost:
    """FLOPs and HBM bytes of one decode step: ``batch`` new tokens over caches of ``context`` tokens.

    ``n_params`` is ``N``, the parameters the step reads (:func:`params_read_per_step`).
    FLOPs ``= batch (2 N + 4 L H d S)``; bytes ``= N b + 2 L H_kv d S b batch`` (module docstring).
    ``context = 0`` leaves the cache out. A model with a ``sliding_window`` ``W``
    (Mistral-7B) attends to, and keeps, only ``min(S, W)`` tokens.
    """
    check_positive("n_params", n_params, finite=True)
    check_positive_int("batch", batch)
    check_nonnegative_int("context", context)
    attended = cached_tokens(context, config.sliding_window) if context else 0
    flops = batch * (2.0 * n_params + 4.0 * config.n_layers * config.n_heads * config.head_dim * attended)
    cache = kv_cache_bytes(config.n_layers, config.n_kv_heads, config.head_dim, attended, batch,
                           bytes_per_elem) if attended else 0
    return OpCost(flops, float(n_params) * bytes_per_elem + cache)


def decode_tokens_per_second(n_params: float, config: AttentionConfig, batch: int, context: int,
                             gpu: str = "H100-SXM", precision: str = "fp16", bytes_per_elem: int = 2) -> float:
    """Roofline upper bound on decode throughput: ``batch / max(FLOPs / peak, bytes / bandwidth)`` tokens/s."""
    cost = decode_step_cost(n_params, config, batch, context, bytes_per_elem)
    return batch / min_seconds(cost, gpu, precision)


def max_batch(n_params: float, config: AttentionConfig, context: int, gpu: str = "H100-SXM",
              bytes_per_elem: int = 2) -> int:
    """Sequences of ``context`` tokens whose caches fit beside the weights: ``floor((HBM - P b) / cache)``.

    ``n_params`` is ``P``, *all* the parameters (:func:`param_count`): they all sit in memory.

    An upper bound: activations and the framework's own memory are left out, and it assumes no
    memory is wasted by the allocator (the paged ideal).
    """
    check_positive_int("context", context)
    free = hardware.spec(gpu).hbm_bytes - n_params * bytes_per_elem
    if free <= 0:
        raise ValueError(f"the weights ({n_params * bytes_per_elem / 1e9:.1f} GB) do not fit in one {gpu}")
    return int(free // kv_cache_bytes(config.n_layers, config.n_kv_heads, config.head_dim, context, 1,
                                      bytes_per_elem, config.sliding_window))
