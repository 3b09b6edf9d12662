"""Plan a training run: memory per GPU and time per step for a DP x TP x PP layout of a transformer.

Inputs: the :class:`Model` (layers, hidden size, heads, vocabulary, sequence
length; optionally FFN size, GQA kv heads, a gated FFN), the :class:`Cluster`
(GPU type from :func:`utils.gpu.hardware.spec`, GPU count, NVLink domain,
NIC bandwidth per GPU) and the :class:`Layout` (DP, TP, PP, interleaving v,
micro-batch, global batch, ZeRO stage over DP, gradient bytes, sequence
parallelism, recomputation). :func:`plan` returns a :class:`Plan`: memory on
the fullest pipeline stage, whether it fits, and a step time split into
compute, pipeline bubble and exposed communication.

Every assumption, stated once:

1. Memory, per pipeline stage (:mod:`utils.parallel.model.stage_memory`; the plan
   reports the fullest). Model state is mixed-precision Adam, 2 bytes of weights,
   ``grad_bytes`` of gradients (2 in the ZeRO paper's fp16 recipe, 4 where
   gradients are accumulated in fp32) and 12 of optimizer state per parameter
   of the stage, sharded over DP by the ZeRO stage
   (:func:`utils.parallel.memory.zero_model_state_breakdown`). A stage holds
   its layers; the first also the (vocabulary-parallel) input embedding, the
   last the output layer (or, tied, a copy of the embedding). Activations are
   Korthikanti et al. 2022, Table 2 (:func:`utils.parallel.memory.activation_bytes_per_layer`,
   written for a GPT layer with a 4h GELU MLP and dropout: an approximation
   for GQA and gated FFNs) times the layers' worth of micro-batches the stage
   holds at its peak, counted on Megatron's schedule
   (:func:`utils.parallel.model.pipeline.stage_orders`): ``min(p - r, m)``
   micro-batches of its layers under 1F1B, and with v-way interleaving
   ``pv + p - 1 - 2r`` chunk-micro-batches on stage r, which on the first stage
   is the ``1 + (p - 1)/(pv)`` of :func:`utils.parallel.model.activations.interleave_factor`
   (Korthikanti section 4.2.3) when ``m >= 2p``. Full recomputation adds one
   layer's un-recomputed activations as working memory; the last stage adds
   one micro-batch's logits (bf16 plus fp32 for the loss). No allowance for
   the CUDA context, NCCL buffers or fragmentation (a few GB in practice): a
   plan within a few GB of the limit is a maybe.
2. Compute. Matmul FLOPs as Narayanan et al. 2021 count them
   (:class:`utils.parallel.planning.transformer_costs.Model`; recomputation adds a
   forward, full, or the attention matrices, selective), run at
   ``efficiency`` x the GPU's dense bf16 peak (:data:`COMPUTE_EFFICIENCY`,
   fitted on Megatron-LM's Table 1 only), optionally times the tile and wave
   quantization of the layer's GEMMs on one GPU, which falls as TP shrinks
   them (``gemm_quantization=True``; NVIDIA's Matrix Multiplication
   Background guide, :meth:`Model.gemm_quantization_efficiency`).
3. Pipeline bubble: ``(p - 1) / (v m + p - 1)`` of the step (1F1B, v-way
   interleaved; Narayanan et al. 2021, section 2.2).
4. Communication, alpha-beta rings (:func:`utils.parallel.comm.network.ring_allreduce_time`),
   ranks numbered TP fastest, then PP, then DP: a group whose span fits in one
   NVLink domain uses NVLink (half the spec's both-directions figure, per
   direction), otherwise the NIC. Latencies :data:`NVLINK_LATENCY_S` and
   :data:`NIC_LATENCY_S` (assumed, as in the networking chapter).
   TP: 4 all-reduces of ``s b h`` 16-bit values per layer per micro-batch
   (6 with full recomputation, whose extra forward repeats two), never
   overlapped, with or without sequence parallelism (whose re-gather in
   backward is left out: :data:`BLIND_SPOTS`); a TP group of whole NVLink domains all-reduces hierarchically
   (NVLink inside, NICs between: :func:`utils.parallel.comm.network.hierarchical_allreduce_time`,
   as the tensor-parallelism chapter prices it). PP: an ``s b h / t`` send forward and one backward per
   micro-batch per chunk (Megatron's scatter/gather, section 4.1), never
   overlapped. DP: one gradient reduce-scatter (``grad_bytes`` per value) and
   one parameter all-gather (2 bytes; ZeRO-3 a second one, ZeRO-0 an
   all-reduce of the gradients instead) of the largest stage's parameters per
   step (:func:`dp_phase_seconds`), each a flat ring with one ring per NIC
   (:func:`dp_collective_seconds`): a DP group with ``k`` ranks per node sends
   only ``1/k`` of its ring traffic through each GPU's NIC, the rest over
   NVLink (the networking chapter's ``flat_ring_allreduce_time(..., rings=k)``,
   as the DDP chapter prices NCCL's rings). With ``Layout(dp_overlap=True)``
   (the default) the gathers overlap one micro-batch's forward and the
   reduction the last micro-batch's backward, as DDP's buckets and FSDP's
   prefetch schedule them, one layer's share never hidden
   (:func:`exposed_comm_seconds`); with ``False`` all of it is exposed.

What it cannot see is listed in :data:`BLIND_SPOTS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from utils.gpu.hardware import GpuSpec, spec
from utils.parallel.memory import ZERO_STAGES, tensor_parallel_allreduce_bytes_per_layer
from utils.parallel.comm.network import flat_ring_allreduce_time, hierarchical_allreduce_time, ring_allreduce_time
from utils.parallel.model.pipeline import ideal_bubble_fraction
from utils.parallel.model.stage_memory import (  # noqa: F401 (re-exported: the planner's memory half)
    BYTES_PER_VALUE,
    chunk_layers,
    first_stage_memory,
    fullest_stage,
    peak_layers_in_flight,
    stage_memory,
    stage_params,
)
from utils.parallel.planning.transformer_costs import Model, check_recompute as _check_recompute
from utils.validate import check_nonnegative, check_positive, check_positive_int

COMPUTE_EFFICIENCY = 0.52
"""Fraction of dense bf16 peak the matrix multiplications reach, the planner's one free parameter.

Fitted on the ten rows of Narayanan et al. 2021, Table 1 (A100) alone, so that
the planner's mean log error there is zero
(:func:`utils.parallel.planning.published_runs.fit_efficiency`, rounded to 0.01); the
two Llama 3 rows (H100) are then scored out of sample. The tests check both. It
was 0.54 while DP traffic crossed the NIC on every ring hop and hid behind
nothing; pricing NCCL's rings (0.53) and DP's overlap (0.52) lowered the fit."""
NVLINK_LATENCY_S = 2e-6
"""Assumed per-step latency of an NVLink ring step (seconds), as in the networking chapter."""
NIC_LATENCY_S = 5e-6
"""Assumed per-step latency of a ring step through the NIC (seconds), as in the networking chapter."""
GRAD_BYTES = (2, 4)
"""Bytes per gradient value: 2 (fp16/bf16, the ZeRO paper's recipe) or 4 (fp32 accumulation and reduction)."""

BLIND_SPOTS: tuple[tuple[str, str], ...] = (
    ("one efficiency for every GEMM", "no dependence on GEMM shape, GPU generation or software; the "
     "quantization option sees only tile and wave effects"),
    ("no non-matmul time", "LayerNorm, softmax, GELU/SwiGLU, dropout, optimizer step: folded into the efficiency"),
    ("no context or expert parallelism here", "plan() is DP x TP x PP; planner_5d adds CP (Llama 3 at 128K) "
     "and EP (MoE models)"),
    ("a GPT layer's activations", "Korthikanti's 34 sbh/t counts dropout masks and a 4h GELU MLP; a Llama "
     "layer (no dropout, SwiGLU, GQA) stores a little less"),
    ("no embedding or loss activations but the logits", "embedding dropout, the final norm and chunked "
     "cross-entropy are not modelled"),
    ("Megatron's depth-first order only", "interleaving with groups of p micro-batches; Llama 3's tunable N "
     "(more in flight) is not modelled"),
    ("no allocator or runtime", "CUDA context, NCCL buffers, fragmentation: a few GB per GPU"),
    ("no overlap of TP or PP communication", "and DP's hides only behind one micro-batch's compute: not in the "
     "pipeline's cooldown bubble, not behind TP's all-reduces; NCCL's kernels take no SMs from the GEMMs"),
    ("sequence parallelism priced as TP's all-reduces", "Megatron keeps each GPU's s/t shard of a "
     "column-parallel layer's input and all-gathers it again in backward for the weight gradient: two more "
     "all-gathers of s b h per layer, 25 % more TP bytes (overlapped there with the input-gradient GEMM)"),
    ("one NIC per GPU, no congestion", "alpha-beta rings at the stated bandwidth, NCCL's one ring per NIC for "
     "DP; no link efficiency (nccl-tests rings reach 76-82% of NVLink: the scorecard's collectives rows), "
     "topology or contention"),
    ("no stragglers, failures or checkpoints", "a step is its ideal time"),
)
"""What the planner cannot see, (what, why it matters): the chapter prints it beside the error plot."""


@dataclass(frozen=True)
class Cluster:
    """``n_gpus`` GPUs of type ``gpu``; ``nvlink_domain`` of them share NVLink; each has its own NIC.

    ``nic_bandwidth``: bytes/s per GPU, one direction (default 50e9, 400 Gb/s NDR; 200 Gb/s HDR is 25e9).
    """

    gpu: str
    n_gpus: int
    nvlink_domain: int = 8
    nic_bandwidth: float = 50e9

    def __post_init__(self) -> None:
        spec(self.gpu)  # ValueError naming the known GPUs
        check_positive_int("n_gpus", self.n_gpus)
        check_positive_int("nvlink_domain (GPUs per NVLink domain)", self.nvlink_domain)
        check_positive("nic_bandwidth (bytes/s per GPU)", self.nic_bandwidth, finite=True)

    @property
    def spec(self) -> GpuSpec:
        return spec(self.gpu)


@dataclass(frozen=True)
class Layout:
    """How the run is split: ``dp x tp x pp`` GPUs, ``global_batch`` sequences of ``micro_batch`` each.

    ``v``: model chunks per pipeline rank (interleaved 1F1B). ``zero_stage``:
    ZeRO over DP (0 = plain DP). ``grad_bytes``: 2 (fp16/bf16 gradients, the
    ZeRO paper's 16 bytes per parameter) or 4 (fp32 gradients: Megatron's 18
    for bf16 weights, Llama 3's fp32 accumulation and reduce-scatter).
    ``balance_embedding``: Llama 3's layout, the first and last stage hold one
    layer fewer (``layers + 2`` divisible by pp): the embedding and the output
    layer each take a layer's slot. ``dp_overlap``: the DP collectives run
    beside compute as DDP's buckets and FSDP's prefetch schedule them (True:
    PyTorch DDP and FSDP, torchtitan, Megatron-core's overlapped
    reduce-scatter; priced by :func:`exposed_comm_seconds`); False: they run
    after backward and nothing hides (Megatron-LM's 2021 "local" DDP), the
    upper bound the planner used before.
    """

    dp: int
    tp: int
    pp: int
    micro_batch: int
    global_batch: int
    v: int = 1
    zero_stage: int = 0
    sequence_parallel: bool = False
    recompute: str = "none"
    balance_embedding: bool = False
    grad_bytes: int = 2
    dp_overlap: bool = True

    def __post_init__(self) -> None:
        for attr in ("dp", "tp", "pp", "micro_batch", "global_batch", "v"):
            check_positive_int(attr, getattr(self, attr))
        if self.zero_stage not in ZERO_STAGES or isinstance(self.zero_stage, bool):
            raise ValueError(f"zero_stage must be one of {ZERO_STAGES}, got {self.zero_stage!r}")
        if self.grad_bytes not in GRAD_BYTES or isinstance(self.grad_bytes, bool):
            raise ValueError(f"grad_bytes must be one of {GRAD_BYTES} (16- or 32-bit gradients), "
                             f"got {self.grad_bytes!r}")
        _check_recompute(self.recompute)
        for flag in ("sequence_parallel", "balance_embedding", "dp_overlap"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if self.global_batch % (self.dp * self.micro_batch):
            raise ValueError(f"global_batch ({self.global_batch}) must be divisible by dp x micro_batch "
                             f"({self.dp} x {self.micro_batch} = {self.dp * self.micro_batch})")

    @property
    def microbatches(self) -> int:
        """Micro-batches per pipeline per step: ``m = B / (d b)``."""
        return self.global_batch // (self.dp * self.micro_batch)


def check_layout(model: Model, cluster: Cluster, layout: Layout) -> None:
    """``ValueError`` naming what is allowed unless the layout splits this model over this cluster."""
    if layout.dp * layout.tp * layout.pp != cluster.n_gpus:
        raise ValueError(f"dp x tp x pp must equal the number of GPUs ({cluster.n_gpus}), got "
                         f"{layout.dp} x {layout.tp} x {layout.pp} = {layout.dp * layout.tp * layout.pp}")
    if model.heads % layout.tp:
        raise ValueError(f"tp must divide the number of heads ({model.heads}), got tp={layout.tp}")
    model.kv_width_per_rank(layout.tp)  # GQA: tp must divide the KV heads, or be a multiple of them
    if layout.tp > cluster.nvlink_domain and layout.tp % cluster.nvlink_domain:
        raise ValueError(f"a TP group larger than the NVLink domain must span whole domains: tp must be a "
                         f"multiple of {cluster.nvlink_domain}, got tp={layout.tp}")
    slots = model.layers + (2 if layout.balance_embedding else 0)
    what = "layers + 2 (balance_embedding)" if layout.balance_embedding else "layers"
    if slots % layout.pp:
        raise ValueError(f"pp must divide {what} ({slots}), got pp={layout.pp}")
    if (slots // layout.pp) % layout.v:
        raise ValueError(f"v must divide the layers per pipeline rank ({slots // layout.pp}), got v={layout.v}")
    if layout.v > 1 and layout.microbatches % layout.pp:
        raise ValueError(f"the interleaved schedule needs the micro-batches per pipeline ({layout.microbatches}) "
                         f"to be a multiple of pp ({layout.pp}) (Narayanan et al. 2021, section 2.2.2)")


@dataclass(frozen=True)
class Plan:
    """Bytes per GPU on the fullest pipeline stage and seconds per step, by part, with the derived rates."""

    memory: dict[str, float]
    capacity_bytes: float
    time: dict[str, float]
    model_flops: float
    hardware_flops: float
    tokens_per_step: int
    n_gpus: int
    peak_flops: float
    stage: int = 0
    """Which pipeline stage ``memory`` is for: the one that holds the most bytes (0 = first)."""

    @property
    def memory_bytes(self) -> float:
        return sum(self.memory.values())

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.capacity_bytes

    @property
    def step_seconds(self) -> float:
        return sum(self.time.values())

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_seconds

    @property
    def tflops_per_gpu(self) -> float:
        """Achieved TFLOP/s per GPU counting recomputation, as Narayanan et al. 2021 report it."""
        return self.hardware_flops / (self.step_seconds * self.n_gpus) / 1e12

    @property
    def model_tflops_per_gpu(self) -> float:
        return self.model_flops / (self.step_seconds * self.n_gpus) / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilization: model FLOP/s (no recomputation) over peak (Chowdhery et al. 2022, PaLM)."""
        return self.model_tflops_per_gpu * 1e12 / self.peak_flops


def _link(span: int, cluster: Cluster) -> tuple[float, float]:
    """(bytes/s per direction, latency) for a group spanning ``span`` consecutive ranks."""
    if span <= cluster.nvlink_domain:
        return cluster.spec.nvlink_bandwidth / 2, NVLINK_LATENCY_S
    return cluster.nic_bandwidth, NIC_LATENCY_S


def _tp_allreduce_time(layout: Layout, cluster: Cluster, nbytes: float) -> float:
    """One TP all-reduce: a ring over NVLink inside a domain, hierarchical over whole domains (chapter 06)."""
    t, g = layout.tp, cluster.nvlink_domain
    nvlink = cluster.spec.nvlink_bandwidth / 2
    if t <= g:
        return ring_allreduce_time(t, nbytes, nvlink, NVLINK_LATENCY_S)
    return hierarchical_allreduce_time(nbytes, g, t // g, nvlink, NVLINK_LATENCY_S, cluster.nic_bandwidth,
                                       NIC_LATENCY_S)


def dp_ranks_per_node(layout: Layout, cluster: Cluster) -> int:
    """How many GPUs of one DP group share an NVLink domain: ``k`` of the group's ``d``, the same on every node.

    Ranks are numbered TP fastest, then PP, then DP, so a DP group's members
    are ``t p`` ranks apart. The whole group shares one domain when ``t p d <= g``
    (``k = d``); a stride of a whole domain or more puts every member on its
    own node (``k = 1``); a stride ``t p`` dividing ``g`` puts ``g / (t p)`` of
    them on each node (``gcd`` with ``d``, so that ``k`` divides the group).
    A stride that does not divide ``g`` spreads the group unevenly: counted as ``k = 1``.
    """
    stride, g, d = layout.tp * layout.pp, cluster.nvlink_domain, layout.dp
    if stride * d <= g:
        return d
    if stride >= g or g % stride:
        return 1
    return math.gcd(d, g // stride)


def dp_collective_seconds(layout: Layout, cluster: Cluster, nbytes: float) -> float:
    """One DP reduce-scatter or all-gather of ``nbytes`` per GPU: half a flat ring all-reduce, one ring per NIC.

    The ``d`` ranks sit ``k`` to a node (:func:`dp_ranks_per_node`) on
    ``d / k`` nodes. NCCL runs several rings (channels) at once, each entering
    and leaving a node through a different NIC (Jeaugey, NVIDIA/nccl issue
    #412: "data can flow from the NIC to the nearest GPU, go through all the
    other GPUs through NVLink, then exit from the last GPU, back to the NIC",
    one such flow per NIC). That is the networking chapter's flat ring with one
    ring per NIC, :func:`utils.parallel.comm.network.flat_ring_allreduce_time`
    with ``rings = k`` (chapter 05, section 10; the DDP chapter prices DDP's
    all-reduce with it): a step moves ``c = S / (k d)`` over every hop and lasts
    ``max(a_nvl + k c / B_nvl, a_nic + c / B_nic)``, so of each GPU's
    ``2(d-1)/d S`` only the ``1/k`` on its own ring's exit hop crosses its NIC.
    A reduce-scatter or all-gather is half of it. ``k = 1`` (a stride of a
    whole node, as under TP 8) is the plain ring over the NICs; ``k = d`` the ring over NVLink.
    """
    k = dp_ranks_per_node(layout, cluster)
    return flat_ring_allreduce_time(nbytes, k, layout.dp // k, cluster.spec.nvlink_bandwidth / 2, NVLINK_LATENCY_S,
                                    cluster.nic_bandwidth, NIC_LATENCY_S, rings=k) / 2


def exposed_comm_seconds(comm_seconds: float, compute_seconds: float, units: int) -> float:
    """Seconds of one phase's communication left exposed when it overlaps the phase's compute unit by unit.

    ``max(C / L, C - (L - 1) / L * T)`` for ``C`` seconds of communication and
    ``T`` of compute, both spread evenly over ``L`` units (layers). One unit's
    share is never hidden: a forward cannot start before its first unit's
    all-gather, and the last unit's reduce-scatter (DDP's last bucket) cannot
    start before backward has produced its gradients. The rest hides behind the
    other ``L - 1`` units' compute, and what does not fit shows. Exact for
    equal units on one communication stream: FSDP's prefetched forward
    (:func:`utils.parallel.data.fsdp_schedule.simulate_fsdp_step`:
    ``t_ag + (L - 1) max(0, t_ag - t_f)``) and DDP's equal buckets
    (:func:`utils.parallel.data.overlap.ddp_timeline`); for FSDP's backward,
    whose gathers and reduce-scatters share the stream, it is the same when
    compute is longer and a close bound otherwise (the tests compare both).
    """
    check_nonnegative("comm_seconds", comm_seconds)
    check_nonnegative("compute_seconds", compute_seconds)
    check_positive_int("units", units)
    return max(comm_seconds / units, comm_seconds - (units - 1) / units * compute_seconds)


def dp_phase_seconds(model: Model, cluster: Cluster, layout: Layout) -> dict[str, float]:
    """Seconds of DP communication per step by the pass it can overlap: ``{"forward": ..., "backward": ...}``.

    One reduce-scatter of the largest stage's gradients (``grad_bytes`` per
    value) and all-gathers of its 16-bit parameters
    (:func:`dp_collective_seconds`). Backward holds the reduction; ZeRO-0's
    all-reduce is a reduce-scatter and an all-gather of the gradients, both
    there (and no parameter gather). ZeRO-1 and
    2 all-gather the updated parameters as the next forward needs them (FSDP's
    SHARD_GRAD_OP, Megatron-core's overlapped parameter gather); ZeRO-3
    gathers in forward and again in backward.
    """
    values = max(stage_params(model, layout, r) for r in {0, layout.pp // 2, layout.pp - 1})
    reduce = dp_collective_seconds(layout, cluster, values * layout.grad_bytes)
    gather = dp_collective_seconds(layout, cluster, values * BYTES_PER_VALUE)
    if layout.zero_stage == 0:  # DDP's all-reduce of the gradients, in their own dtype
        return {"forward": 0.0, "backward": 2 * reduce}
    return {"forward": gather, "backward": reduce + (gather if layout.zero_stage == 3 else 0.0)}


def step_time(model: Model, cluster: Cluster, layout: Layout, efficiency: float = COMPUTE_EFFICIENCY,
              gemm_quantization: bool = False) -> dict[str, float]:
    """Seconds per step: compute, pipeline bubble, and exposed TP, PP and DP communication."""
    check_positive("efficiency", efficiency)
    if efficiency > 1:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    peak = cluster.spec.flops("bf16")
    m, s, b, h = layout.microbatches, model.seq_len, layout.micro_batch, model.hidden
    if gemm_quantization:
        efficiency *= model.gemm_quantization_efficiency(s * b, layout.tp, cluster.spec.sm_count)
    compute = model.hardware_flops(layout.global_batch, layout.recompute) / (cluster.n_gpus * peak * efficiency)
    f = ideal_bubble_fraction("interleaved" if layout.v > 1 else "1f1b", layout.pp, m, layout.v)
    bubble = compute * f / (1 - f)

    layers = (model.layers + (2 if layout.balance_embedding else 0)) // layout.pp
    per_layer = 4 + (2 if layout.recompute == "full" else 0)
    nbytes = tensor_parallel_allreduce_bytes_per_layer(s, b, h, BYTES_PER_VALUE)
    tp = per_layer * layers * m * _tp_allreduce_time(layout, cluster, nbytes)

    pp = 0.0
    if layout.pp > 1:
        bw, lat = _link(layout.tp * layout.pp, cluster)
        pp = 2 * layout.v * m * (lat + s * b * h * BYTES_PER_VALUE / layout.tp / bw)

    phases = dp_phase_seconds(model, cluster, layout)
    if layout.dp_overlap:
        # Each phase overlaps one micro-batch's pass through this stage: the gradients are final only in the
        # last micro-batch's backward, the parameters are needed from the first one's forward.
        forward_share = model.model_flops(1) / 3 / model.hardware_flops(1, layout.recompute)
        passes = {"forward": compute * forward_share / m, "backward": compute * (1 - forward_share) / m}
        dp = sum(exposed_comm_seconds(phases[k], passes[k], layers) for k in phases)
    else:
        dp = sum(phases.values())
    return {"compute": compute, "pipeline bubble": bubble, "TP communication": tp,
            "PP communication": pp, "DP communication (exposed)": dp}


def plan(model: Model, cluster: Cluster, layout: Layout, efficiency: float = COMPUTE_EFFICIENCY,
         gemm_quantization: bool = False) -> Plan:
    """Memory per GPU (fullest stage) and time per step of ``model`` on ``cluster`` with ``layout``."""
    check_layout(model, cluster, layout)
    g = cluster.spec
    stage = fullest_stage(model, layout)
    return Plan(memory=stage_memory(model, layout, stage), capacity_bytes=float(g.hbm_bytes),
                time=step_time(model, cluster, layout, efficiency, gemm_quantization),
                model_flops=model.model_flops(layout.global_batch),
                hardware_flops=model.hardware_flops(layout.global_batch, layout.recompute),
                tokens_per_step=layout.global_batch * model.seq_len, n_gpus=cluster.n_gpus,
                peak_flops=g.flops("bf16"), stage=stage)
