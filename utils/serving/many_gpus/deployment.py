"""A deployment calculator: the roofline step of one GPU in a multi-GPU serving layout, and tokens/s per GPU.

A layout says how a model's work is split:

- **tensor parallelism** ``tp`` (Megatron's split, Shoeybi et al. 2019): every
  weight matrix and every attention head is split over ``tp`` GPUs that all see
  the same tokens, with two all-reduces of the activations per layer. KV heads
  are split with them; when ``tp`` exceeds the KV heads, each GPU keeps one and
  the heads are *replicated* (vLLM's rule,
  :func:`utils.parallel.model.head_sharding.kv_head_sharding`). MLA's latent is
  one "head" shared by all query heads, so under TP every GPU caches all of it;
- **data-parallel attention** (SGLang's DP attention for MLA): ``tp = 1`` for
  attention and the dense layers, each GPU runs its own sequences and keeps
  only their caches;
- **expert parallelism** ``ep``: the ``E`` routed experts (plus ``redundant``
  copies of hot ones, DeepSeek's EPLB) are spread over ``ep`` GPUs; each token
  is sent to its ``k`` experts and back (dispatch and combine, two all-to-alls
  per MoE layer), assuming perfect balance: every GPU computes ``k T`` expert
  tokens for its ``T`` own tokens.

One GPU's step is the sum, over the parts it runs, of each part's roofline
(:func:`utils.serving.costs.step_time.step_seconds`'s rule), plus communication:
``2 L`` ring all-reduces over NVLink (half its two-way figure each way) for TP
(:func:`utils.parallel.comm.network.ring_allreduce_time`, latency left out), and
for EP the bytes each GPU sends to other GPUs over its network link. A TP
all-reduce sits between two layers and adds to the step; with ``overlap=True``
the EP all-to-alls hide behind computation (DeepSeek's and SGLang's two
micro-batches), so the step is ``max(compute, comm)``. With
speculative decoding or multi-token prediction each sequence computes ``q``
tokens per step and keeps ``accepted`` of them on average.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from utils.attention.decode_cost import FFN_AND_VOCAB, params_read_per_step
from utils.attention.kv_cache import MODELS as ATTENTION_MODELS, AttentionConfig
from utils.gpu import hardware
from utils.gpu.roofline import OpCost
from utils.parallel.comm.network import ring_allreduce_time
from utils.parallel.frontier.moe_costs import MODELS as MOE_MODELS, gqa_attention_params, moe_param_counts
from utils.parallel.model.head_sharding import kv_head_sharding
from utils.serving.costs.step_time import attention_flops_per_pair
from utils.validate import check_nonnegative_int, check_positive, check_positive_int


@dataclass(frozen=True)
class ModelShape:
    """Parameters of a model by the part of the step that reads them (all layers together)."""

    name: str
    attention: AttentionConfig
    hidden: int
    attention_params: int
    dense_params: int
    shared_expert_params: int
    expert_params: int
    moe_layers: int
    n_routed: int
    top_k: int
    lm_head_params: int


def dense_shape(name: str) -> ModelShape:
    """A LLaMA-style dense model (:data:`utils.attention.decode_cost.FFN_AND_VOCAB`): no experts."""
    if name not in FFN_AND_VOCAB:
        raise ValueError(f"unknown dense model {name!r}; known: {', '.join(FFN_AND_VOCAB)}")
    c = ATTENTION_MODELS[name]
    attention = c.n_layers * gqa_attention_params(c.hidden, c.n_heads, c.n_kv_heads, c.head_dim)
    lm_head = FFN_AND_VOCAB[name][1] * c.hidden
    return ModelShape(name, c, c.hidden, attention, params_read_per_step(name) - attention - lm_head, 0, 0, 0, 1, 1,
                      lm_head)


def moe_shape(name: str = "DeepSeek-V3") -> ModelShape:
    """An MoE model of :data:`utils.parallel.frontier.moe_costs.MODELS` with its attention of
    :data:`utils.attention.kv_cache.MODELS` (DeepSeek-V3: MLA, 3 dense layers, 1 shared and 256 routed experts)."""
    if name not in MOE_MODELS or name not in ATTENTION_MODELS:
        raise ValueError(f"unknown MoE model {name!r}; known: DeepSeek-V3")
    m = MOE_MODELS[name]
    expert, moe_layers = 3 * m.hidden * m.expert_ffn, m.n_layers - m.n_dense_layers
    return ModelShape(name, ATTENTION_MODELS[name], m.hidden, m.n_layers * m.attention_params,
                      m.n_dense_layers * 3 * m.hidden * m.dense_ffn, moe_layers * m.n_shared * expert, expert,
                      moe_layers, m.n_routed, m.top_k, moe_param_counts(m)["embedding"])


@dataclass(frozen=True)
class Layout:
    """How the work is split, and the precisions: weights and cache in bytes per element, matmul precision."""

    tp: int = 1
    ep: int = 1
    redundant_experts: int = 0
    tokens_per_step: int = 1
    accepted_per_step: float = 1.0
    overlap: bool = True
    weight_bytes: float = 2.0
    kv_bytes: int = 2
    matmul_precision: str = "bf16"
    network_bytes_per_s: float = 50e9
    dispatch_bytes: float = 1.0
    combine_bytes: float = 2.0
    nodes_per_token: int | None = None
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        for name in ("tp", "ep", "tokens_per_step"):
            check_positive_int(name, getattr(self, name))
        check_nonnegative_int("redundant_experts", self.redundant_experts)
        if not 1 <= self.accepted_per_step <= self.tokens_per_step:
            raise ValueError(f"accepted_per_step must be in [1, tokens_per_step={self.tokens_per_step}], "
                             f"got {self.accepted_per_step!r}")
        if self.nodes_per_token is not None:
            check_positive_int("nodes_per_token", self.nodes_per_token)
        check_positive_int("gpus_per_node", self.gpus_per_node)
        if self.tp > 1 and self.ep > 1:
            raise ValueError("combine tp > 1 with ep > 1 is not modelled; use tp (dense/TP MoE) or ep (DP attention)")


class Step(NamedTuple):
    """One GPU's step: seconds per part (compute rooflines and communication) and the step's total."""

    parts: dict[str, float]
    compute: float
    comm: float
    seconds: float


def _roof(cost: OpCost, peak: float, bandwidth: float) -> float:
    return max(cost.flops / peak, cost.nbytes / bandwidth)


def kv_bytes_per_token_per_gpu(model: ModelShape, layout: Layout) -> int:
    """Cache bytes one GPU keeps per token of a sequence it serves: its share of the KV heads (replicated past
    ``n_kv``), all of an MLA latent."""
    c = model.attention
    if c.kind == "MLA":
        return c.cache_bytes(bytes_per_elem=layout.kv_bytes)
    heads = kv_head_sharding(c.n_heads, c.n_kv_heads, layout.tp, replicate_kv=True).kv_heads_per_rank
    return 2 * c.n_layers * heads * c.head_dim * layout.kv_bytes


def weight_bytes_per_gpu(model: ModelShape, layout: Layout) -> float:
    """Weights one GPU holds: everything over ``tp``, and with ``ep`` its ``(E + redundant) / ep`` experts per layer."""
    slots = (model.n_routed + layout.redundant_experts) / layout.ep if layout.ep > 1 else model.n_routed / layout.tp
    common = (model.attention_params + model.dense_params + model.shared_expert_params + model.lm_head_params) / layout.tp
    return layout.weight_bytes * (common + (slots * model.moe_layers * model.expert_params if model.moe_layers else 0))


def ep_bytes_per_token(model: ModelShape, layout: Layout) -> float:
    """Bytes one token sends over the network per MoE layer: dispatch (``dispatch_bytes`` per element) and
    combine (``combine_bytes``) of its ``hidden`` activations, to each remote destination.

    Without ``nodes_per_token`` each of the ``k`` experts is a destination, remote with probability
    ``(ep - g) / ep`` for ``g`` GPUs per node (DeepEP's low-latency kernels for decode send every copy over
    RDMA). With ``nodes_per_token = M`` (DeepSeek-V3's node-limited routing, arXiv:2412.19437, section 2.1.2:
    at most 4 nodes; DeepEP's normal kernels for prefill) a token crosses the network once per remote node
    of at most ``M``: ``min(M, n) (n - 1) / n`` of the ``n = ep / g`` nodes, then fans out over NVLink.
    """
    per_copy = model.hidden * (layout.dispatch_bytes + layout.combine_bytes)
    nodes = max(1.0, layout.ep / layout.gpus_per_node)
    if layout.nodes_per_token is None:
        return model.top_k * per_copy * max(0.0, layout.ep - layout.gpus_per_node) / layout.ep
    return min(layout.nodes_per_token, nodes) * (nodes - 1) / nodes * per_copy


def nvlink_bytes_per_token(model: ModelShape, layout: Layout) -> float:
    """Bytes one token sends per MoE layer to the other GPUs of its own node: the ``k (min(ep, g) - 1) / ep``
    expert copies that land there, each dispatched and combined over NVLink."""
    per_copy = model.hidden * (layout.dispatch_bytes + layout.combine_bytes)
    return model.top_k * per_copy * (min(layout.ep, layout.gpus_per_node) - 1) / layout.ep


def step(model: ModelShape, layout: Layout, batch: int, context: int, gpu: str = "H100-SXM",
         prefill: bool = False) -> Step:
    """One GPU's step: ``batch`` sequences (those of its TP group, or its own under DP attention) over ``context``.

    Decode (``prefill=False``): each sequence computes ``layout.tokens_per_step`` tokens attending to
    ``context`` cached ones. Prefill: ``batch`` prompts of ``context`` tokens each, causal, with MLA run
    unabsorbed. ``ValueError`` if weights and caches do not fit in ``gpu``'s memory.
    """
    check_positive_int("batch", batch)
    check_positive_int("context", context)
    g = hardware.spec(gpu)
    peak, bw, tp = g.flops(layout.matmul_precision), g.hbm_bandwidth, layout.tp
    tokens = batch * (context if prefill else layout.tokens_per_step)
    kv = kv_bytes_per_token_per_gpu(model, layout)
    if weight_bytes_per_gpu(model, layout) + batch * context * kv > g.hbm_bytes:
        raise ValueError(f"{batch} sequences of {context} tokens do not fit beside the weights on one {gpu}")
    pairs = batch * (context * (context + 1) // 2 if prefill else context * layout.tokens_per_step)
    f_pair = attention_flops_per_pair(model.attention, absorbed=not prefill) / tp  # MLA: absorbed in decode only
    lm_tokens = batch if prefill else tokens  # logits: the last prompt token, or every computed token
    wb = layout.weight_bytes
    parts = {
        "attention weights": _roof(OpCost(2 * model.attention_params / tp * tokens, wb * model.attention_params / tp),
                                   peak, bw),
        "attention (cache)": _roof(OpCost(f_pair * pairs, batch * context * kv), g.flops("bf16"), bw),
        "dense FFN + shared experts + LM head": _roof(OpCost(
            2 * (model.dense_params + model.shared_expert_params) / tp * tokens + 2 * model.lm_head_params / tp * lm_tokens,
            wb * (model.dense_params + model.shared_expert_params + model.lm_head_params) / tp), peak, bw),
    }
    comm = 0.0
    if model.moe_layers:
        expert_tokens = tokens * model.top_k  # per GPU: its own tokens' k experts (EP, balanced) or 1/tp of each
        slots = (model.n_routed + layout.redundant_experts) / layout.ep if layout.ep > 1 else model.n_routed
        touched = min(slots, expert_tokens) if layout.ep > 1 else min(model.n_routed, expert_tokens)
        parts["routed experts"] = _roof(OpCost(2 * expert_tokens * model.expert_params * model.moe_layers / tp,
                                               wb * touched * model.expert_params * model.moe_layers / tp), peak, bw)
        if layout.ep > 1:  # the network and NVLink carry their shares at the same time
            network, nvlink = ep_bytes_per_token(model, layout), nvlink_bytes_per_token(model, layout)
            comm += model.moe_layers * tokens * max(network / layout.network_bytes_per_s,
                                                    nvlink / (g.nvlink_bandwidth / 2))
    if tp > 1:
        per_allreduce = ring_allreduce_time(tp, tokens * model.hidden * 2, g.nvlink_bandwidth / 2, 0.0)
        comm += 2 * model.attention.n_layers * per_allreduce
    compute = sum(parts.values())
    parts["communication"] = comm
    # EP's all-to-alls hide behind the other micro-batch; a TP all-reduce feeds the next layer and cannot
    seconds = max(compute, comm) if layout.overlap and tp == 1 else compute + comm
    return Step(parts, compute, comm, seconds)


def tokens_per_gpu_per_s(model: ModelShape, layout: Layout, batch: int, context: int, gpu: str = "H100-SXM",
                         prefill: bool = False) -> float:
    """Output tokens (decode) or prompt tokens (prefill) per second per GPU: ``batch x (accepted or context)
    / step``, over the ``tp`` GPUs that share the batch."""
    s = step(model, layout, batch, context, gpu, prefill)
    per_seq = context if prefill else layout.accepted_per_step
    return batch * per_seq / s.seconds / layout.tp


def tpot_seconds(model: ModelShape, layout: Layout, batch: int, context: int, gpu: str = "H100-SXM") -> float:
    """Time per output token of each sequence: the step over the tokens it keeps, ``step / accepted``."""
    return step(model, layout, batch, context, gpu).seconds / layout.accepted_per_step


def best_at_tpot(model: ModelShape, layout: Layout, context: int, tpot_target: float,
                 gpu: str = "H100-SXM") -> tuple[int, float]:
    """``(batch, tokens/s per GPU)`` at the largest batch whose TPOT meets ``tpot_target`` and whose caches fit;
    ``(0, 0.0)`` if none does."""
    check_positive("tpot_target", tpot_target, finite=True)

    def ok(b: int) -> bool:
        try:
            return tpot_seconds(model, layout, b, context, gpu) <= tpot_target
        except ValueError:  # does not fit in memory
            return False

    if not ok(1):
        return 0, 0.0
    lo, hi = 1, 2
    while ok(hi) and hi < 1 << 20:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # ok(lo), not ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, tokens_per_gpu_per_s(model, layout, lo, context, gpu)
