"""Planning in five dimensions: context parallelism (dense models) and expert parallelism (MoE models).

:mod:`utils.parallel.planning.planner` plans DP x TP x PP, with ZeRO stages 0-3
over DP (stage 3 is FSDP: parameters, gradients and optimizer state divided by
DP, the parameters all-gathered twice a step and the gradients
reduce-scattered once). This module adds the two other axes of a frontier run.

**Context parallelism**, :func:`plan_cp`. CP splits every sequence of ``s``
tokens into ``cp`` chunks on ``cp`` GPUs (ranks numbered TP fastest, then CP,
then PP, then DP, Llama 3's order, arXiv:2407.21783 section 3.3.2). Outside
attention each CP rank is a data-parallel rank holding sequences of ``s / cp``
tokens: its activations, TP all-reduces, PP sends and logits are those of
``s / cp`` tokens, and the gradients are reduced over ``dp x cp`` ranks. So
:func:`plan_cp` runs :func:`~utils.parallel.planning.planner.plan` on that
equivalent layout (``dp x cp`` data-parallel ranks, sequences of ``s / cp``,
``cp`` times as many of them: the same tokens and micro-batches per step) and
then corrects the two things attention changes:

1. compute: attention's score FLOPs grow with the whole ``s``, not ``s / cp``
   (``4 b s^2 h`` per layer forward, Narayanan et al. 2021's count, which the
   planner's efficiency was fitted on); the bubble is rescaled with it;
2. the K/V exchange of ring attention (:mod:`utils.parallel.frontier.context_parallel`):
   ``cp - 1`` steps per layer, each sending one K/V block
   (:func:`~utils.parallel.frontier.context_parallel.ring_step_costs`) while
   the rank computes a causal zigzag step (half a block's FLOPs); a step whose
   transfer takes longer than its compute exposes the difference. Backward
   moves K/V and their gradients against twice the compute: counted as twice
   the forward's exposure. Whether the ring hides at all is the closed form
   :func:`~utils.parallel.frontier.context_parallel.min_local_seq_to_hide`.
   (Llama 3 all-gathers K/V instead of passing them round a ring: the same
   ``(cp - 1)/cp`` of K and V reaches each rank.)

**Expert parallelism**, :func:`plan_moe`, for an
:class:`~utils.parallel.frontier.moe_costs.MoEModel` (parameter counts from
:func:`~utils.parallel.frontier.moe_costs.moe_param_counts`): ``pp`` stages of
``n / pp`` GPUs, TP ``tp`` inside a node, data-parallel ``dp = n / (pp tp)``
for everything but the routed experts, which are split ``ep`` ways inside the
DP group and data-parallel over the remaining ``dp / ep`` (DeepSeek-V3's
layout: PP 16, EP 64, DP 128 on 2,048 GPUs, section 3.2). Per MoE layer and
micro-batch, four all-to-alls (dispatch and combine, forward and backward),
priced by :func:`ep_all_to_all_seconds`: by default every expert copy of
:func:`~utils.parallel.frontier.expert_parallel.all_to_all_bytes` at capacity
factor 1, on NVLink inside a node and the NIC across nodes (each TP rank sends
its ``s b / tp`` tokens, sequence parallelism); optionally node-limited
(:func:`~utils.parallel.frontier.expert_parallel.node_limited_all_to_all_bytes`)
and with an 8-bit dispatch (DeepSeek-V3, sections 3.2.2 and 3.3.3). A fraction
``ep_overlap`` hides behind compute (DeepSeek-V3's DualPipe, section 3.2.1,
hides nearly all). Compute is ``3 x`` :func:`~utils.parallel.frontier.moe_costs.forward_flops_per_token`
plus attention's score FLOPs, at the planner's one efficiency. Activations are
Korthikanti's GPT-layer formula (:func:`utils.parallel.memory.activation_bytes_per_layer`),
an approximation for MLA and an MoE FFN; the 1F1B peak of ``min(pp, m)``
micro-batches on the first stage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from utils.parallel.comm.network import ring_allreduce_time
from utils.parallel.frontier.context_parallel import min_local_seq_to_hide, ring_step_costs
from utils.parallel.frontier.expert_parallel import (all_to_all_bytes, all_to_all_seconds,
                                                     node_limited_all_to_all_bytes)
from utils.parallel.frontier.moe_costs import MoEModel, forward_flops_per_token, moe_param_counts
from utils.parallel.memory import ZERO_STAGES, activation_bytes_per_layer, zero_model_state_breakdown
from utils.parallel.model.pipeline import ideal_bubble_fraction
from utils.parallel.planning.planner import (BYTES_PER_VALUE, COMPUTE_EFFICIENCY, GRAD_BYTES, NIC_LATENCY_S,
                                             NVLINK_LATENCY_S, Cluster, Layout, Plan, _link, _tp_allreduce_time, plan)
from utils.parallel.planning.transformer_costs import Model
from utils.validate import check_element_size, check_nonnegative, check_positive, check_positive_int


def _check_fraction(name: str, value: float) -> float:
    if not 0 <= check_nonnegative(name, value) <= 1:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return float(value)


def cp_equivalent(model: Model, layout: Layout, cp: int) -> tuple[Model, Layout]:
    """The DP x TP x PP problem a CP run is outside attention: ``dp cp`` ranks, sequences of ``s / cp``.

    ``ValueError`` unless ``2 cp`` divides the sequence (zigzag chunks, Llama 3 section 3.3.2).
    """
    check_positive_int("cp", cp)
    if model.seq_len % (2 * cp):
        raise ValueError(f"seq_len ({model.seq_len}) must be divisible by 2 x cp = {2 * cp} (zigzag chunks)")
    short = dataclasses.replace(model, seq_len=model.seq_len // cp)
    return short, dataclasses.replace(layout, dp=layout.dp * cp, global_batch=layout.global_batch * cp)


def cp_exposed_seconds_per_layer(model: Model, cluster: Cluster, layout: Layout, cp: int,
                                 efficiency: float = COMPUTE_EFFICIENCY) -> float:
    """Seconds per layer per micro-batch (forward and backward) the ring's K/V transfers are not hidden.

    Forward: ``cp - 1`` steps of ``max(0, bytes / B + latency - f * flops / R)``
    with one K/V block (:func:`ring_step_costs` on this TP rank's heads), ``f``
    = 1/2 (a causal zigzag step), ``R`` = efficiency x bf16 peak and ``B`` the
    CP group's link (NVLink if ``tp cp`` GPUs fit in one domain, else the NIC);
    backward counted as twice the forward.
    """
    check_positive_int("cp", cp)
    if cp == 1:
        return 0.0
    head_dim = model.hidden // model.heads
    kv_heads = model.kv_width_per_rank(layout.tp) // head_dim
    nbytes, flops = ring_step_costs(model.seq_len // cp, model.heads // layout.tp, kv_heads, head_dim,
                                    layout.micro_batch, BYTES_PER_VALUE)
    bw, lat = _link(layout.tp * cp, cluster)
    rate = cluster.spec.flops("bf16") * efficiency
    forward = (cp - 1) * max(0.0, nbytes / bw + lat - 0.5 * flops / rate)
    return 3 * forward


def cp_ring_hides(model: Model, cluster: Cluster, layout: Layout, cp: int,
                  efficiency: float = COMPUTE_EFFICIENCY) -> bool:
    """Whether each rank's ``s / cp`` tokens exceed :func:`min_local_seq_to_hide` (causal zigzag, f = 1/2)."""
    head_dim = model.hidden // model.heads
    bw, _ = _link(layout.tp * cp, cluster)
    n_star = min_local_seq_to_hide(model.heads // layout.tp, model.kv_width_per_rank(layout.tp) // head_dim,
                                   cluster.spec.flops("bf16") * efficiency, bw, BYTES_PER_VALUE, 0.5)
    return model.seq_len // cp >= n_star


def plan_cp(model: Model, cluster: Cluster, layout: Layout, cp: int = 1,
            efficiency: float = COMPUTE_EFFICIENCY) -> Plan:
    """:func:`plan` with context parallelism ``cp``: ``layout.dp x tp x pp x cp`` must equal the GPUs.

    ``cp = 1`` returns exactly :func:`plan`'s result. The plan gains a
    ``"CP communication (exposed)"`` time. The DP term is :func:`plan`'s on the
    equivalent layout (``layout.dp_overlap`` decides whether it overlaps), hidden
    behind the short sequences' compute, before attention's is scaled up: a little
    conservative.
    """
    short, equivalent = cp_equivalent(model, layout, cp)
    if layout.dp * layout.tp * layout.pp * cp != cluster.n_gpus:
        raise ValueError(f"dp x tp x pp x cp must equal the number of GPUs ({cluster.n_gpus}), got "
                         f"{layout.dp} x {layout.tp} x {layout.pp} x {cp}")
    base = plan(short, cluster, equivalent, efficiency=efficiency)
    if cp == 1:
        return base
    time = dict(base.time)
    hardware = model.hardware_flops(layout.global_batch, layout.recompute)
    scale = hardware / short.hardware_flops(equivalent.global_batch, layout.recompute)
    time["compute"] *= scale
    time["pipeline bubble"] *= scale
    layers = (model.layers + (2 if layout.balance_embedding else 0)) // layout.pp
    time["CP communication (exposed)"] = (layers * equivalent.microbatches
                                          * cp_exposed_seconds_per_layer(model, cluster, layout, cp, efficiency))
    return dataclasses.replace(base, time=time, model_flops=model.model_flops(layout.global_batch),
                               hardware_flops=hardware)


@dataclass(frozen=True)
class MoELayout:
    """``pp`` stages x ``dp`` data-parallel ranks x ``tp``; the routed experts split ``ep`` ways inside DP.

    ``global_batch`` sequences of ``seq_len`` tokens, ``micro_batch`` at a
    time; ZeRO ``zero_stage`` over DP (the experts' over ``dp / ep``).
    """

    pp: int
    dp: int
    ep: int
    seq_len: int
    micro_batch: int
    global_batch: int
    tp: int = 1
    zero_stage: int = 1
    grad_bytes: int = 4
    recompute: str = "selective"

    def __post_init__(self) -> None:
        for attr in ("pp", "dp", "ep", "seq_len", "micro_batch", "global_batch", "tp"):
            check_positive_int(attr, getattr(self, attr))
        if self.dp % self.ep:
            raise ValueError(f"ep must divide dp (experts are split inside the data-parallel group), "
                             f"got dp={self.dp}, ep={self.ep}")
        if self.zero_stage not in ZERO_STAGES or isinstance(self.zero_stage, bool):
            raise ValueError(f"zero_stage must be one of {ZERO_STAGES}, got {self.zero_stage!r}")
        if self.grad_bytes not in GRAD_BYTES:
            raise ValueError(f"grad_bytes must be one of {GRAD_BYTES}, got {self.grad_bytes!r}")
        if self.global_batch % (self.dp * self.micro_batch):
            raise ValueError(f"global_batch ({self.global_batch}) must be divisible by dp x micro_batch "
                             f"({self.dp * self.micro_batch})")

    @property
    def microbatches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def n_gpus(self) -> int:
        return self.pp * self.dp * self.tp


def moe_training_flops_per_token(model: MoEModel, seq_len: int, heads: int, qk_head_dim: int, v_head_dim: int) -> float:
    """``3 x`` (forward matmul FLOPs + attention scores ``2 s heads (d_qk + d_v)`` per layer), no causal halving."""
    scores = model.n_layers * 2.0 * seq_len * heads * (qk_head_dim + v_head_dim)
    return 3 * (forward_flops_per_token(model) + scores)


def ep_all_to_all_seconds(model: MoEModel, cluster: Cluster, layout: MoELayout, element_size: int = BYTES_PER_VALUE,
                          max_nodes: int | None = None) -> float:
    """Seconds for one all-to-all of one MoE layer and micro-batch, ``element_size`` bytes per value.

    Each TP rank sends its ``s b / t`` tokens (sequence parallelism). Without
    ``max_nodes`` (the default): every expert copy is sent on its own, the
    padded buffer of :func:`all_to_all_bytes` at capacity factor 1, all of it at
    the EP group's link (the NIC once the group spans nodes). With
    ``max_nodes = M`` and a group that spans nodes: DeepSeek-V3's node-limited
    dispatch (:func:`node_limited_all_to_all_bytes`), each token sent once over
    the network to each remote node it visits and fanned out there over NVLink,
    the two overlapped (DeepSeek-V3 section 3.2.2): the longer of the two
    pairwise exchanges, one between nodes and one inside a node.
    """
    L, t = layout, layout.tp
    tokens, span, g = max(1, L.seq_len * L.micro_batch // t), t * L.ep, cluster.nvlink_domain
    if max_nodes is not None:
        check_positive_int("max_nodes", max_nodes)
    if max_nodes is None or span <= g:
        bw, lat = _link(span, cluster)
        nbytes = all_to_all_bytes(tokens, model.hidden, model.n_routed, model.top_k, 1.0, L.ep, element_size)
        return all_to_all_seconds(L.ep, nbytes, bw, lat)
    if span % g or g % t:
        raise ValueError(f"node-limited routing needs the EP group to fill whole nodes: tp x ep ({t} x {L.ep}) "
                         f"a multiple of the NVLink domain ({g}), and tp dividing it")
    per_node = g // t
    network, nvlink = node_limited_all_to_all_bytes(tokens, model.hidden, model.top_k, L.ep, per_node, max_nodes,
                                                    element_size)
    return max(all_to_all_seconds(L.ep // per_node, network, cluster.nic_bandwidth, NIC_LATENCY_S),
               all_to_all_seconds(per_node, nvlink, cluster.spec.nvlink_bandwidth / 2, NVLINK_LATENCY_S))


def plan_moe(model: MoEModel, heads: int, qk_head_dim: int, v_head_dim: int, cluster: Cluster, layout: MoELayout,
             efficiency: float = COMPUTE_EFFICIENCY, ep_overlap: float = 0.0, dp_overlap: float = 0.0,
             dispatch_bytes: int = BYTES_PER_VALUE, combine_bytes: int = BYTES_PER_VALUE,
             max_nodes: int | None = None) -> Plan:
    """Memory per GPU (first stage) and time per step of an MoE model under PP x DP(EP) x TP (module docstring).

    The all-to-alls (:func:`ep_all_to_all_seconds`): two per MoE layer and
    micro-batch carry ``dispatch_bytes`` per value towards the experts (the
    forward's dispatch, and in backward the gradient before the
    down-projections), two carry ``combine_bytes`` back (the forward's
    combine, the backward's gradient of the dispatch). DeepSeek-V3 sends the
    first two in FP8 (``dispatch_bytes=1``) and keeps both combines in BF16
    (section 3.3.3). ``max_nodes``: node-limited routing (DeepSeek-V3: 4,
    sections 2.1.2 and 4.2). The defaults (2, 2, ``None``) price every expert
    copy in BF16.
    """
    check_positive("efficiency", efficiency)
    if efficiency > 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    ep_overlap, dp_overlap = _check_fraction("ep_overlap", ep_overlap), _check_fraction("dp_overlap", dp_overlap)
    L, t = layout, layout.tp
    if L.n_gpus != cluster.n_gpus:
        raise ValueError(f"pp x dp x tp must equal the number of GPUs ({cluster.n_gpus}), got {L.pp} x {L.dp} x {t}")
    if L.pp > model.n_layers or model.n_routed % L.ep or heads % t or t > cluster.nvlink_domain:
        raise ValueError(f"pp must be at most the layers ({model.n_layers}), ep divide the routed experts "
                         f"({model.n_routed}), tp divide the heads ({heads}) and fit in one NVLink domain "
                         f"({cluster.nvlink_domain}); got pp={L.pp}, ep={L.ep}, tp={t}")
    counts = moe_param_counts(model)
    # The fullest stage: ceil(layers / pp) layers, ceil(MoE layers / pp) of them MoE; the rest spread evenly.
    layers, moe_layers = -(-model.n_layers // L.pp), -(-(model.n_layers - model.n_dense_layers) // L.pp)
    experts = counts["routed_experts"] / (model.n_layers - model.n_dense_layers) * moe_layers / L.ep
    dense = (counts["total"] - counts["routed_experts"]) / (L.pp * t)
    state = [zero_model_state_breakdown(n, g, L.zero_stage, grad_bytes_per_param=L.grad_bytes)
             for n, g in ((dense, L.dp), (experts, L.dp // L.ep))]
    m, s, b, h = L.microbatches, L.seq_len, L.micro_batch, model.hidden
    activations = min(L.pp, m) * layers * activation_bytes_per_layer(s, b, h, heads, t, t > 1, L.recompute)
    memory = {"parameters": sum(x.params for x in state), "gradients": sum(x.grads for x in state),
              "optimizer": sum(x.optimizer for x in state), "activations": activations}

    peak = cluster.spec.flops("bf16")
    tokens = L.global_batch * s
    flops = tokens * moe_training_flops_per_token(model, s, heads, qk_head_dim, v_head_dim)
    compute = flops / (cluster.n_gpus * peak * efficiency)
    f = ideal_bubble_fraction("1f1b", L.pp, m)
    one = {e: ep_all_to_all_seconds(model, cluster, L, check_element_size(e), max_nodes)
           for e in {dispatch_bytes, combine_bytes}}
    ep = 2 * moe_layers * m * (one[dispatch_bytes] + one[combine_bytes]) * (1 - ep_overlap)
    tp = 4 * layers * m * _tp_allreduce_time(L, cluster, s * b * h * BYTES_PER_VALUE) if t > 1 else 0.0
    pp = 0.0
    if L.pp > 1:
        bw, lat = _link(cluster.n_gpus, cluster)
        pp = 2 * m * (lat + s * b * h * BYTES_PER_VALUE / t / bw)
    dp = 0.0
    gathers = 2 if L.zero_stage == 3 else 1
    for values, group, span in ((dense, L.dp, t * L.dp), (experts, L.dp // L.ep, cluster.n_gpus)):
        bw, lat = _link(span, cluster)
        dp += (ring_allreduce_time(group, values * L.grad_bytes, bw, lat)
               + gathers * ring_allreduce_time(group, values * BYTES_PER_VALUE, bw, lat)) / 2
    time = {"compute": compute, "pipeline bubble": compute * f / (1 - f), "TP communication": tp,
            "PP communication": pp, "EP all-to-all (exposed)": ep, "DP communication (exposed)": dp * (1 - dp_overlap)}
    return Plan(memory=memory, capacity_bytes=float(cluster.spec.hbm_bytes), time=time, model_flops=flops,
                hardware_flops=flops, tokens_per_step=tokens, n_gpus=cluster.n_gpus, peak_flops=peak)


def gpu_hours_per_trillion_tokens(p: Plan) -> float:
    """GPU-hours to train on 10^12 tokens at the plan's rate: ``n_gpus x 10^12 / tokens_per_s / 3600``."""
    return p.n_gpus * 1e12 / p.tokens_per_s / 3600
