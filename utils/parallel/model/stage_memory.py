"""Bytes per GPU on each pipeline stage of a planned run: model state, activations in flight, logits.

The memory half of :mod:`utils.parallel.planning.planner` (whose docstring states the
assumptions). The part that needs care is how many micro-batches' activations
a stage holds at its peak. It is counted by walking the order in which
Megatron's schedules run the stage's forwards and backwards
(:func:`utils.parallel.model.pipeline.stage_orders`): a forward of a model chunk
stores that chunk's layers until its backward. Under 1F1B stage r holds
``min(p - r, m)`` micro-batches of its layers (Narayanan et al. 2021,
section 2.2.1); interleaved with v chunks per stage and m a multiple of p, it
holds ``min(m v, p v + p - 1 - 2r)`` chunk-micro-batches, on the first stage
``1 + (p - 1)/(p v)`` times 1F1B's (Korthikanti et al. 2022, section 4.2.3;
:func:`utils.parallel.model.activations.interleave_factor`) once ``m >= 2p``. The
count is in layers, so that chunks of unequal size (Llama 3's embedding-only
first chunk) are counted right.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from utils.parallel.memory import activation_bytes_per_layer, zero_model_state_breakdown
from utils.parallel.model.pipeline import stage_orders
from utils.parallel.planning.transformer_costs import Model

if TYPE_CHECKING:
    from utils.parallel.planning.planner import Layout

BYTES_PER_VALUE = 2
"""Activations and parameters are 16-bit (gradients: ``Layout.grad_bytes``)."""
LOSS_BYTES_PER_LOGIT = 4
"""The fp32 copy of the logits that softmax and cross-entropy work on, next to the bf16 logits."""


def chunk_layers(model: Model, layout: Layout, stage: int) -> list[int]:
    """Transformer layers in each of the ``v`` model chunks of pipeline ``stage``.

    ``L / (p v)`` each; with ``balance_embedding`` the embedding takes a layer's
    slot in the first chunk of the first stage and the output layer one in the
    last chunk of the last stage (Llama 3, section 3.3.2: "the first model
    chunk on the first stage has only the embedding" when a chunk is one slot).
    """
    p, v = layout.pp, layout.v
    if not 0 <= stage < p:
        raise ValueError(f"stage must be in 0..{p - 1}, got {stage}")
    balanced = layout.balance_embedding and p > 1
    per_chunk = (model.layers + (2 if balanced else 0)) // (p * v)
    layers = [per_chunk] * v
    if balanced and stage == 0:
        layers[0] -= 1
    if balanced and stage == p - 1:
        layers[-1] -= 1
    return layers


@lru_cache(maxsize=64)
def _orders(kind: str, p: int, m: int, v: int) -> tuple:
    return tuple(tuple(order) for order in stage_orders(kind, p, m, v))


def peak_layers_in_flight(model: Model, layout: Layout, stage: int) -> int:
    """Layer-micro-batches whose activations ``stage`` holds at its peak, walking Megatron's order.

    Each forward of a chunk stores its layers' activations until that chunk's
    backward (:func:`utils.parallel.model.pipeline.stage_orders`). 1F1B: ``min(p - r, m)``
    micro-batches of the stage's layers. Interleaved, m a multiple of p:
    ``min(m v, p v + p - 1 - 2 r)`` chunks on stage r; with equal chunks the
    first stage thus holds ``1 + (p - 1)/(p v)`` times 1F1B's ``L/p`` layers of
    p micro-batches (:func:`utils.parallel.model.activations.interleave_factor`).
    """
    layers = chunk_layers(model, layout, stage)
    kind = "interleaved" if layout.v > 1 else "1f1b"
    held = peak = 0
    for op, chunk, _ in _orders(kind, layout.pp, layout.microbatches, layout.v)[stage]:
        held += layers[chunk] if op == "F" else -layers[chunk]
        peak = max(peak, held)
    return peak


def stage_params(model: Model, layout: Layout, stage: int) -> float:
    """Parameters on one GPU of pipeline ``stage``: its layers, plus the embedding (first) or output layer (last).

    Split t ways by TP; with GQA and ``t > kv_heads`` the K and V weights are replicated.
    """
    t, h = layout.tp, model.hidden
    per_layer = (model.params_per_layer - 2 * h * model.kv_dim) / t + 2 * h * model.kv_width_per_rank(t)
    n_layers = sum(chunk_layers(model, layout, stage))
    if layout.pp == 1:
        return n_layers * per_layer + model.embedding_params / t
    edge = (stage == 0) + (stage == layout.pp - 1)  # input embedding; output layer (or its tied copy)
    return n_layers * per_layer + edge * model.vocab * h / t


def stage_memory(model: Model, layout: Layout, stage: int = 0) -> dict[str, float]:
    """Bytes per GPU on pipeline ``stage``: parameters, gradients, optimizer, activations, logits (planner docstring)."""
    state = zero_model_state_breakdown(stage_params(model, layout, stage), layout.dp, layout.zero_stage,
                                       grad_bytes_per_param=layout.grad_bytes)
    act = dict(seq_len=model.seq_len, micro_batch=layout.micro_batch, hidden=model.hidden, n_heads=model.heads,
               tp=layout.tp, sequence_parallel=layout.sequence_parallel)
    activations = peak_layers_in_flight(model, layout, stage) * activation_bytes_per_layer(
        **act, recompute=layout.recompute)
    working = activation_bytes_per_layer(**act, recompute="none") if layout.recompute == "full" else 0.0
    logits = 0.0
    if stage == layout.pp - 1:  # one micro-batch's logits: bf16, plus fp32 for softmax and loss
        logits = model.seq_len * layout.micro_batch * model.vocab / layout.tp * (BYTES_PER_VALUE + LOSS_BYTES_PER_LOGIT)
    return {"parameters": state.params, "gradients": state.grads, "optimizer": state.optimizer,
            "activations": activations, "recompute working set": working, "logits": logits}


def first_stage_memory(model: Model, layout: Layout) -> dict[str, float]:
    """:func:`stage_memory` of the first pipeline stage."""
    return stage_memory(model, layout, 0)


def fullest_stage(model: Model, layout: Layout) -> int:
    """The pipeline stage with the most bytes per GPU (the first one, unless interleaving or balancing moves it)."""
    return max(range(layout.pp), key=lambda r: (sum(stage_memory(model, layout, r).values()), -r))
