"""Plan a training run: memory per GPU and time per step for a DP x TP x PP layout of a transformer.

Inputs: the :class:`Model` (layers, hidden size, heads, vocabulary, sequence
length; optionally FFN size, GQA kv heads, a gated FFN), the :class:`Cluster`
(GPU type from :func:`utils.gpu.hardware.spec`, GPU count, NVLink domain,
NIC bandwidth per GPU) and the :class:`Layout` (DP, TP, PP, interleaving v,
micro-batch, global batch, ZeRO stage over DP, sequence parallelism,
recomputation). :func:`plan` returns a :class:`Plan`: memory on the first
pipeline stage (the fullest one under 1F1B), whether it fits, and a step
time split into compute, pipeline bubble and exposed communication.

Every assumption, stated once:

1. Memory. Model state is mixed-precision Adam (2 + 2 + 12 bytes per
   parameter, ZeRO paper) of the first stage's parameters, sharded over DP by
   the ZeRO stage (:func:`utils.parallel.memory.zero_model_state_breakdown`).
   The first stage holds ``L/p`` layers and the (vocabulary-parallel) input
   embedding. Activations are Korthikanti et al. 2022, Table 2
   (:func:`utils.parallel.memory.activation_bytes_per_layer`, written for a
   GPT layer with a 4h GELU MLP: an approximation for GQA and gated FFNs)
   for ``min(p, m)`` micro-batches in flight (1F1B, Narayanan et al. 2021,
   section 2.2.1; the interleaved schedule's few extra are ignored). Full
   recomputation adds one layer's un-recomputed activations as working
   memory; a single-stage model adds the logits (bf16 plus fp32 for the loss).
   No allowance for the CUDA context, NCCL buffers or fragmentation (a few GB
   in practice): a plan within a few GB of the limit is a maybe.
2. Compute. Matmul FLOPs as Narayanan et al. 2021 count them
   (:class:`utils.parallel.transformer_costs.Model`; recomputation adds a
   forward, full, or the attention matrices, selective), run at
   ``efficiency`` x the GPU's dense bf16 peak: one number for every layout
   (:data:`COMPUTE_EFFICIENCY`), no dependence on GEMM shape.
3. Pipeline bubble: ``(p - 1) / (v m + p - 1)`` of the step (1F1B, v-way
   interleaved; Narayanan et al. 2021, section 2.2).
4. Communication, alpha-beta rings (:func:`utils.parallel.network.ring_allreduce_time`),
   ranks numbered TP fastest, then PP, then DP: a group whose span fits in one
   NVLink domain uses NVLink (half the spec's both-directions figure, per
   direction), otherwise the NIC. Latencies :data:`NVLINK_LATENCY_S` and
   :data:`NIC_LATENCY_S` (assumed, as in the networking chapter).
   TP: 4 all-reduces of ``s b h`` 16-bit values per layer per micro-batch
   (6 with full recomputation, whose extra forward repeats two), never
   overlapped. PP: an ``s b h / t`` send forward and one backward per
   micro-batch per chunk (Megatron's scatter/gather, section 4.1), never
   overlapped. DP: one gradient reduce-scatter + all-gather (an all-reduce's
   volume; ZeRO-3 1.5x) of the stage's parameters per step, of which a
   fraction ``dp_overlap`` hides behind backward (default 0, nothing
   hidden: the conservative case; DP traffic is a few % of these steps).
"""

from __future__ import annotations

from dataclasses import dataclass

from utils.gpu.hardware import GpuSpec, spec
from utils.parallel.pipeline import ideal_bubble_fraction
from utils.parallel.memory import (
    ZERO_STAGES,
    activation_bytes_per_layer,
    tensor_parallel_allreduce_bytes_per_layer,
    zero_model_state_breakdown,
)
from utils.parallel.network import ring_allreduce_time
from utils.parallel.transformer_costs import Model, check_recompute as _check_recompute
from utils.validate import check_nonnegative, check_positive, check_positive_int

COMPUTE_EFFICIENCY = 0.55
"""Fraction of dense bf16 peak the matrix multiplications reach, the planner's one free parameter.

Chosen once, as a round number, for every row of :mod:`utils.parallel.published_runs`
(A100 and H100 alike); the chapter shows how the error moves with it."""
NVLINK_LATENCY_S = 2e-6
"""Assumed per-step latency of an NVLink ring step (seconds), as in the networking chapter."""
NIC_LATENCY_S = 5e-6
"""Assumed per-step latency of a ring step through the NIC (seconds), as in the networking chapter."""
BYTES_PER_VALUE = 2
"""Activations, gradients and parameters travel in 16-bit precision."""


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
    ZeRO over DP (0 = plain DP). ``balance_embedding``: Llama 3's layout, the
    first and last stage hold one layer fewer (``layers + 2`` divisible by pp).
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

    def __post_init__(self) -> None:
        for attr in ("dp", "tp", "pp", "micro_batch", "global_batch", "v"):
            check_positive_int(attr, getattr(self, attr))
        if self.zero_stage not in ZERO_STAGES or isinstance(self.zero_stage, bool):
            raise ValueError(f"zero_stage must be one of {ZERO_STAGES}, got {self.zero_stage!r}")
        _check_recompute(self.recompute)
        for flag in ("sequence_parallel", "balance_embedding"):
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
    slots = model.layers + (2 if layout.balance_embedding else 0)
    what = "layers + 2 (balance_embedding)" if layout.balance_embedding else "layers"
    if slots % layout.pp:
        raise ValueError(f"pp must divide {what} ({slots}), got pp={layout.pp}")
    if (slots // layout.pp) % layout.v:
        raise ValueError(f"v must divide the layers per pipeline rank ({slots // layout.pp}), got v={layout.v}")


@dataclass(frozen=True)
class Plan:
    """Bytes per GPU on the first pipeline stage and seconds per step, by part, with the derived rates."""

    memory: dict[str, float]
    capacity_bytes: float
    time: dict[str, float]
    model_flops: float
    hardware_flops: float
    tokens_per_step: int
    n_gpus: int
    peak_flops: float

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
        """Model FLOPs utilization: model FLOP/s (no recomputation) over peak (Chowdhery et al. 2022)."""
        return self.model_tflops_per_gpu * 1e12 / self.peak_flops


def _link(span: int, cluster: Cluster) -> tuple[float, float]:
    """(bytes/s per direction, latency) for a group spanning ``span`` consecutive ranks."""
    if span <= cluster.nvlink_domain:
        return cluster.spec.nvlink_bandwidth / 2, NVLINK_LATENCY_S
    return cluster.nic_bandwidth, NIC_LATENCY_S


def first_stage_memory(model: Model, layout: Layout) -> dict[str, float]:
    """Bytes per GPU on the first pipeline stage: parameters, gradients, optimizer, activations, logits."""
    layers = model.layers // layout.pp
    if layout.balance_embedding and layout.pp > 1:  # one layer fewer than the middle stages
        layers = (model.layers + 2) // layout.pp - 1
    params = (layers * model.params_per_layer + model.vocab * model.hidden) / layout.tp
    if layout.pp == 1:
        params = model.n_params / layout.tp
    state = zero_model_state_breakdown(params, layout.dp, layout.zero_stage)
    act = dict(seq_len=model.seq_len, micro_batch=layout.micro_batch, hidden=model.hidden, n_heads=model.heads,
               tp=layout.tp, sequence_parallel=layout.sequence_parallel)
    in_flight = min(layout.pp, layout.microbatches)
    activations = in_flight * layers * activation_bytes_per_layer(**act, recompute=layout.recompute)
    working = activation_bytes_per_layer(**act, recompute="none") if layout.recompute == "full" else 0.0
    logits = 0.0
    if layout.pp == 1:  # the last stage is this one: bf16 logits plus fp32 for softmax and loss
        logits = model.seq_len * layout.micro_batch * model.vocab / layout.tp * (BYTES_PER_VALUE + 4)
    return {"parameters": state.params, "gradients": state.grads, "optimizer": state.optimizer,
            "activations": activations, "recompute working set": working, "logits": logits}


def step_time(model: Model, cluster: Cluster, layout: Layout, efficiency: float = COMPUTE_EFFICIENCY,
              dp_overlap: float = 0.0) -> dict[str, float]:
    """Seconds per step: compute, pipeline bubble, and exposed TP, PP and DP communication."""
    check_positive("efficiency", efficiency)
    if efficiency > 1 or not 0 <= check_nonnegative("dp_overlap", dp_overlap) <= 1:
        raise ValueError(f"efficiency must be in (0, 1] and dp_overlap in [0, 1], got {efficiency}, {dp_overlap}")
    peak = cluster.spec.flops("bf16")
    m, s, b, h = layout.microbatches, model.seq_len, layout.micro_batch, model.hidden
    compute = model.hardware_flops(layout.global_batch, layout.recompute) / (cluster.n_gpus * peak * efficiency)
    f = ideal_bubble_fraction("interleaved" if layout.v > 1 else "1f1b", layout.pp, m, layout.v)
    bubble = compute * f / (1 - f)

    layers = (model.layers + (2 if layout.balance_embedding else 0)) // layout.pp
    per_layer = 4 + (2 if layout.recompute == "full" else 0)
    bw, lat = _link(layout.tp, cluster)
    nbytes = tensor_parallel_allreduce_bytes_per_layer(s, b, h, BYTES_PER_VALUE)
    tp = per_layer * layers * m * ring_allreduce_time(layout.tp, nbytes, bw, lat)

    pp = 0.0
    if layout.pp > 1:
        bw, lat = _link(layout.tp * layout.pp, cluster)
        pp = 2 * layout.v * m * (lat + s * b * h * BYTES_PER_VALUE / layout.tp / bw)

    grads = first_stage_memory(model, layout)["parameters"]
    if layout.zero_stage == 3:
        grads *= layout.dp  # the breakdown divided parameters by dp; the collectives move all of them
    bw, lat = _link(layout.tp * layout.pp * layout.dp, cluster)
    dp = ring_allreduce_time(layout.dp, grads, bw, lat) * (1.5 if layout.zero_stage == 3 else 1.0)
    return {"compute": compute, "pipeline bubble": bubble, "TP communication": tp,
            "PP communication": pp, "DP communication (exposed)": dp * (1 - dp_overlap)}


def plan(model: Model, cluster: Cluster, layout: Layout, efficiency: float = COMPUTE_EFFICIENCY,
         dp_overlap: float = 0.0) -> Plan:
    """Memory per GPU and time per step of ``model`` trained on ``cluster`` with ``layout`` (module docstring)."""
    check_layout(model, cluster, layout)
    g = cluster.spec
    return Plan(memory=first_stage_memory(model, layout), capacity_bytes=float(g.hbm_bytes),
                time=step_time(model, cluster, layout, efficiency, dp_overlap),
                model_flops=model.model_flops(layout.global_batch),
                hardware_flops=model.hardware_flops(layout.global_batch, layout.recompute),
                tokens_per_step=layout.global_batch * model.seq_len, n_gpus=cluster.n_gpus,
                peak_flops=g.flops("bf16"))
