"""Two five-dimensional runs held against :mod:`utils.parallel.planning.planner_5d`: Llama 3 at 128K, DeepSeek-V3.

- Llama 3 405B, the 128K-context row of Table 4 of arXiv:2407.21783: TP 8,
  CP 16, PP 16, DP 8 on 16,384 H100s, 16M tokens per batch (128 sequences of
  131,072), 380 TFLOP/s per GPU, 38 % BF16 MFU. Everything else as the 8K rows of
  :mod:`utils.parallel.planning.published_runs` (FSDP as ZeRO-2, fp32 gradients,
  sequence parallelism, FlashAttention, one layer fewer on the edge stages, v = 8).
- DeepSeek-V3 (arXiv:2412.19437): 2,048 H800s (section 3.1); "16-way Pipeline
  Parallelism (PP), 64-way Expert Parallelism (EP) spanning 8 nodes, and ZeRO-1
  Data Parallelism (DP)", no tensor parallelism (section 3.2); batch 15,360
  sequences of 4,096 tokens after the first 469B tokens (section 4.2); IB
  50 GB/s per GPU (section 3.2.2, :data:`utils.parallel.frontier.expert_parallel.PUBLISHED`);
  "training DeepSeek-V3 on each trillion tokens requires only 180K H800 GPU
  hours" (section 1 and Table 1: 2,664K GPU hours for 14.8T tokens). The
  model is :data:`utils.parallel.frontier.moe_costs.MODELS` ``"DeepSeek-V3"``
  (MLA: 128 heads, query/key head 128 + 64, value head 128; the MTP module left out).

What the rows assume that the papers do not print: micro-batch 1 in both; for
DeepSeek-V3 an H100's compute and NVLink for the H800 (same dense BF16 peak,
989 TFLOP/s; the H800's NVLink is 400 GB/s against 900, which only TP would
feel), BF16 at the planner's efficiency though DeepSeek-V3 ran its GEMMs in
FP8, 1F1B's bubble for DualPipe's smaller one, and ``ep_overlap = 1`` (DualPipe
hides the all-to-alls: "near-zero all-to-all communication overhead", section 1).
By default the all-to-alls send every expert copy in BF16; DeepSeek-V3's own
wire format is an option of :func:`deepseek_v3_plan`: node-limited routing to
at most :data:`DSV3_MAX_NODES` nodes per token (sections 2.1.2, 3.2.2, 4.2) and
FP8 dispatch with BF16 combine (section 3.3.3). Llama 3 gathers K/V rather
than passing them round a ring (section 3.3.2): the same bytes reach each rank.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from utils.parallel.frontier.expert_parallel import PUBLISHED as EP_PUBLISHED
from utils.parallel.frontier.moe_costs import MODELS, MoEModel, forward_flops_per_token
from utils.parallel.planning.planner import BYTES_PER_VALUE, COMPUTE_EFFICIENCY, Cluster, Layout, Plan
from utils.parallel.planning.planner_5d import (MoELayout, gpu_hours_per_trillion_tokens, moe_training_flops_per_token,
                                                plan_cp, plan_moe)
from utils.parallel.planning.published_runs import LLAMA3, LLAMA3_405B, LLAMA3_NIC_BYTES_PER_S
from utils.published import Published
from utils.validate import check_positive

DEEPSEEK_V3 = "DeepSeek-AI, 'DeepSeek-V3 Technical Report', arXiv:2412.19437"

LLAMA3_128K = dataclasses.replace(LLAMA3_405B, seq_len=131_072)
"""Llama 3 405B at its 128K context (Table 3 architecture, Table 4's sequence length)."""
LLAMA3_128K_CLUSTER = Cluster("H100-SXM", 16_384, nvlink_domain=8, nic_bandwidth=LLAMA3_NIC_BYTES_PER_S)
LLAMA3_128K_LAYOUT = Layout(dp=8, tp=8, pp=16, micro_batch=1, global_batch=128, v=8, zero_stage=2,
                            sequence_parallel=True, recompute="selective", balance_embedding=True, grad_bytes=4)
LLAMA3_128K_CP = 16
LLAMA3_128K_TFLOPS = Published(380, "TFLOP/s per GPU (model FLOPs), 128K context", LLAMA3 + ", Table 4")
LLAMA3_128K_MFU = Published(38, "% BF16 MFU, 128K context", LLAMA3 + ", Table 4")

DSV3_MODEL: MoEModel = MODELS["DeepSeek-V3"]
DSV3_ATTENTION = {"heads": 128, "qk_head_dim": 128 + 64, "v_head_dim": 128}
"""MLA's shapes for the score FLOPs (deepseek-ai/DeepSeek-V3 config.json: qk_nope 128, qk_rope 64, v 128)."""
DSV3_CLUSTER = Cluster("H100-SXM", 2048, nvlink_domain=8, nic_bandwidth=50e9)
DSV3_LAYOUT = MoELayout(pp=16, dp=128, ep=64, seq_len=4096, micro_batch=1, global_batch=15_360, tp=1, zero_stage=1)
DSV3_GPU_HOURS_PER_T = Published(180e3, "H800 GPU-hours per trillion pre-training tokens",
                                 DEEPSEEK_V3 + ", section 1 and Table 1")
DSV3_PRETRAIN = Published(2_664e3, "H800 GPU-hours of pre-training on 14.8T tokens", DEEPSEEK_V3 + ", Table 1")
H100_REPORTED_MIB = Published(81_559, "MiB of device memory an H100 80GB reports (nvidia-smi, NVML)",
                              "Modal, 'Why does an NVIDIA H100 80GB card offer 85.52 GB?' "
                              "(thundergolfer.com/blog/nvidia-gpu-memory-capacity), table", "measured")
"""85.5 GB where the spec table (and the planner) count 80 GB; no such figure was found for the H800."""
DSV3_MAX_NODES: int = EP_PUBLISHED["deepseek_v3_max_nodes_per_token"].value
"""M = 4: each token is sent to at most 4 of the EP group's 8 nodes (sections 2.1.2, 3.2.2 and 4.2)."""
DSV3_DISPATCH_BYTES = 1
"""FP8 dispatch (and the gradient before the down-projections in backward); both combines stay BF16 (section 3.3.3)."""


class Row(NamedTuple):
    """A published figure next to the planner's, and the relative error in throughput."""

    name: str
    plan: Plan
    predicted: float
    published: Published
    relative_error: float
    """``predicted throughput / published throughput - 1``: +0.10 means the planner is 10 % optimistic."""


def llama3_128k_row(efficiency: float = COMPUTE_EFFICIENCY) -> Row:
    """Llama 3 405B at 128K (CP 16): the planner's model TFLOP/s per GPU against Table 4's 380."""
    p = plan_cp(LLAMA3_128K, LLAMA3_128K_CLUSTER, LLAMA3_128K_LAYOUT, LLAMA3_128K_CP, efficiency=efficiency)
    predicted = p.model_tflops_per_gpu
    return Row("Llama 3 405B, 128K, CP 16", p, predicted, LLAMA3_128K_TFLOPS,
               predicted / LLAMA3_128K_TFLOPS.value - 1)


def deepseek_v3_plan(layout: MoELayout = DSV3_LAYOUT, ep_overlap: float = 1.0,
                     efficiency: float = COMPUTE_EFFICIENCY, model: MoEModel = DSV3_MODEL,
                     cluster: Cluster | None = None, max_nodes: int | None = None,
                     dispatch_bytes: int = BYTES_PER_VALUE) -> Plan:
    """:func:`plan_moe` of DeepSeek-V3 (or another ``layout`` of it) on 2,048 GPUs of 8 per node, IB 50 GB/s.

    ``max_nodes=DSV3_MAX_NODES, dispatch_bytes=DSV3_DISPATCH_BYTES`` is the
    run's own wire format; the defaults send every expert copy in BF16.
    """
    if cluster is None:
        cluster = dataclasses.replace(DSV3_CLUSTER, n_gpus=layout.n_gpus)
    return plan_moe(model, cluster=cluster, layout=layout, efficiency=efficiency, ep_overlap=ep_overlap,
                    dispatch_bytes=dispatch_bytes, max_nodes=max_nodes, **DSV3_ATTENTION)


def deepseek_v3_row(ep_overlap: float = 1.0, efficiency: float = COMPUTE_EFFICIENCY, max_nodes: int | None = None,
                    dispatch_bytes: int = BYTES_PER_VALUE) -> Row:
    """DeepSeek-V3: the planner's H800 GPU-hours per trillion tokens against the report's 180K."""
    p = deepseek_v3_plan(ep_overlap=ep_overlap, efficiency=efficiency, max_nodes=max_nodes,
                         dispatch_bytes=dispatch_bytes)
    predicted = gpu_hours_per_trillion_tokens(p)
    return Row(f"DeepSeek-V3, PP 16 EP 64, all-to-all {ep_overlap:.0%} hidden", p, predicted,
               DSV3_GPU_HOURS_PER_T, DSV3_GPU_HOURS_PER_T.value / predicted - 1)


def deepseek_v3_linear_share() -> float:
    """Share of DeepSeek-V3's training FLOPs (as :func:`plan_moe` counts them) in linear layers, the rest scores."""
    return 3 * forward_flops_per_token(DSV3_MODEL) / moe_training_flops_per_token(DSV3_MODEL, DSV3_LAYOUT.seq_len,
                                                                                   **DSV3_ATTENTION)


def deepseek_v3_all_to_all_ratio(max_nodes: int | None = None, dispatch_bytes: int = BYTES_PER_VALUE,
                                 gemm_speedup: float = 1.0) -> float:
    """All-to-all over compute seconds, nothing hidden: the report's "computation-to-communication ratio", inverted.

    The linear layers' share of the compute (:func:`deepseek_v3_linear_share`)
    runs ``gemm_speedup`` times faster (FP8 GEMMs: 1 is the planner's BF16);
    attention's score matmuls stay BF16 (section 3.3.1).
    """
    check_positive("gemm_speedup", gemm_speedup)
    t = deepseek_v3_plan(ep_overlap=0.0, max_nodes=max_nodes, dispatch_bytes=dispatch_bytes).time
    linear = deepseek_v3_linear_share()
    return t["EP all-to-all (exposed)"] / (t["compute"] * (linear / gemm_speedup + 1 - linear))

