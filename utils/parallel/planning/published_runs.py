"""Published training runs to hold :mod:`utils.parallel.planning.planner` against, with the layouts they used.

Two sources, both checked against the papers' text:

- Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", SC 2021, arXiv:2104.04473, Table 1: GPT models
  from 1.7B to 1T parameters on up to 3,072 A100 80GB GPUs (Selene: 8 GPUs per
  node on NVLink/NVSwitch, eight 200 Gb/s HDR InfiniBand HCAs per node, section
  5), vocabulary 51,200, sequence 2,048, interleaved 1F1B with scatter/gather,
  mixed precision, activation recomputation (eq. 3 counts it). TFLOP/s per GPU
  there are eq. (3) FLOPs over measured time, so they include recomputation.
- Llama Team, "The Llama 3 Herd of Models", arXiv:2407.21783, Table 3 (405B:
  126 layers, hidden 16,384, FFN 53,248, 128 heads, 8 kv heads, vocabulary
  128,000) and Table 4 (TP 8, CP 1, PP 16, DP 64 or 128 on 8,192 or 16,384
  H100s, sequence 8,192, 16M tokens per batch, 430 or 400 TFLOP/s per GPU,
  43% or 41% BF16 MFU). Section 3.3.2: FSDP sharding optimizer states and
  gradients (ZeRO-2 here), no activation checkpointing at 8K, one layer fewer
  on the first and last stages, an interleaved schedule; 400 Gb/s per GPU
  (section 3.3.1).

What the papers do not print, and where the rows take it from. Megatron
rows: micro-batch size and interleaving from the authors' own script for
Table 1, ``examples/sc21/run_table_1.sh`` of NVIDIA/Megatron-LM (section 5.1
says only that the runs use "the interleaved pipeline schedule with the
scatter/gather optimization"): micro-batch 16, 16, 16, 8, 4, 2, 2, 1, 1, 1 and
``--num-layers-per-virtual-pipeline-stage`` 5, 5, 3 and 1 for the 76B, 145B,
310B and 530B models, so v = 3, 2, 2, 3; the 39B (two stages) and 1T
(two layers per stage) rows run without virtual stages, v = 1; and
``--DDP-impl``: PyTorch's overlapped DDP for the four rows without pipeline
parallelism, Megatron's "local" DDP (all-reduce after the pipeline, nothing
hidden) for the others. Full
recomputation (``--recompute-method uniform``), no sequence parallelism (it
came a year later), no ZeRO, 16-bit gradients (the ZeRO recipe: neither the
paper nor the script says otherwise). Llama 3: micro-batch 1 (Table 4's
batch size per DP is then its micro-batches), v = 8: the paper says the first
model chunk of the first stage "has only the embedding" once one layer is
removed, so a chunk is one of the 8 layer slots per rank (its Figure 6 draws
2 chunks for illustration); fp32 gradients (section 3.3.2: "FP32 gradient
accumulation ... and reduce-scatter gradients in FP32"), sequence
parallelism and FlashAttention (``recompute="selective"``: the attention
matrices are not stored).
"""

from __future__ import annotations

from typing import NamedTuple

import math

from utils.parallel.planning.planner import COMPUTE_EFFICIENCY, Cluster, Layout, Model, Plan, plan
from utils.published import Published

NARAYANAN = ("Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
             "Megatron-LM', arXiv:2104.04473")
LLAMA3 = "Llama Team, AI @ Meta, 'The Llama 3 Herd of Models', arXiv:2407.21783"

MEGATRON_VOCAB = 51_200
MEGATRON_SEQ = 2_048
SELENE_NIC_BYTES_PER_S = 200e9 / 8
"""One 200 Gb/s HDR InfiniBand HCA per GPU (Narayanan et al., section 5)."""
LLAMA3_NIC_BYTES_PER_S = 400e9 / 8
"""400 Gb/s per GPU (Llama 3 paper, section 3.3.1)."""


class PublishedRun(NamedTuple):
    """A published run: what was trained, on what, how it was split, and what it achieved."""

    name: str
    model: Model
    cluster: Cluster
    layout: Layout
    tflops_per_gpu: Published
    percent_of_peak: Published
    params_billion: Published | None = None
    counts_recompute: bool = True
    """True where the published TFLOP/s count recomputed FLOPs (Narayanan eq. 3), False for model FLOPs (MFU)."""


# (params in billions, heads, hidden, layers, TP, PP, GPUs, batch, TFLOP/s per GPU, % of peak): Table 1;
# then (micro-batch, v) from examples/sc21/run_table_1.sh (v = layers per stage / layers per virtual stage).
_TABLE_1 = (
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44, 16, 1),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44, 16, 1),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46, 16, 1),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43, 8, 1),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44, 4, 1),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45, 2, 3),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47, 2, 2),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50, 1, 2),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52, 1, 3),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52, 1, 1),
)
MEGATRON_SCRIPT = "NVIDIA/Megatron-LM, examples/sc21/run_table_1.sh (the authors' script for Table 1)"
_DDP_IMPL = ("torch",) * 4 + ("local",) * 6
"""``--DDP-impl`` of each Table 1 row in the same script: PyTorch's DDP, whose bucketed all-reduce overlaps the
last micro-batch's backward, for the four rows without pipeline parallelism; Megatron's own "local" DDP, which
all-reduces the gradients after the whole pipeline schedule (``allreduce_gradients()`` in ``train_step``), for the
rest: ``Layout(dp_overlap=False)``."""


def _megatron(row: tuple, ddp_impl: str) -> PublishedRun:
    billions, heads, hidden, layers, tp, pp, gpus, batch, tflops, pct, micro_batch, v = row
    src = NARAYANAN + ", Table 1"
    name = f"GPT {billions:g}B" if billions < 1000 else "GPT 1T"
    return PublishedRun(
        name=name,
        model=Model(layers, hidden, heads, MEGATRON_VOCAB, MEGATRON_SEQ, name=name),
        cluster=Cluster("A100-SXM4-80GB", gpus, nvlink_domain=8, nic_bandwidth=SELENE_NIC_BYTES_PER_S),
        layout=Layout(dp=gpus // (tp * pp), tp=tp, pp=pp, micro_batch=micro_batch, global_batch=batch, v=v,
                      recompute="full", dp_overlap=ddp_impl == "torch"),
        tflops_per_gpu=Published(tflops, "TFLOP/s per GPU (eq. 3 FLOPs, recomputation included)", src),
        percent_of_peak=Published(pct, "% of 312 TFLOP/s A100 fp16 peak", src),
        params_billion=Published(billions, "billion parameters (eq. 2)", src),
    )


MEGATRON_RUNS: tuple[PublishedRun, ...] = tuple(_megatron(row, ddp) for row, ddp in zip(_TABLE_1, _DDP_IMPL))
"""Every row of Narayanan et al. 2021, Table 1, with the layout the planner assumes for it."""

LLAMA3_405B = Model(layers=126, hidden=16_384, heads=128, vocab=128_000, seq_len=8_192, ffn=53_248, kv_heads=8,
                    gated_ffn=True, tied_embeddings=False, name="Llama 3 405B")
"""Llama 3 405B, Table 3 of arXiv:2407.21783."""

LLAMA3_PARAMS = Published(405e9, "parameters", LLAMA3 + ", Table 3")


def _llama(gpus: int, dp: int, tflops: int, mfu: int) -> PublishedRun:
    src = LLAMA3 + ", Table 4"
    return PublishedRun(
        name=f"Llama 3 405B, {gpus:,} GPUs",
        model=LLAMA3_405B,
        cluster=Cluster("H100-SXM", gpus, nvlink_domain=8, nic_bandwidth=LLAMA3_NIC_BYTES_PER_S),
        # 16M tokens per batch = 2,048 sequences of 8,192 (Table 4: batch size per DP x DP).
        layout=Layout(dp=dp, tp=8, pp=16, micro_batch=1, global_batch=2048, v=8, zero_stage=2,
                      sequence_parallel=True, recompute="selective", balance_embedding=True, grad_bytes=4),
        tflops_per_gpu=Published(tflops, "TFLOP/s per GPU", src),
        percent_of_peak=Published(mfu, "% BF16 MFU", src),
        params_billion=Published(405, "billion parameters", LLAMA3 + ", Table 3"),
        counts_recompute=False,
    )


LLAMA3_RUNS: tuple[PublishedRun, ...] = (_llama(8192, 64, 430, 43), _llama(16384, 128, 400, 41))
"""The two 8K-context rows of Llama 3 Table 4 (the 128K-context row uses context parallelism)."""

PUBLISHED_RUNS: tuple[PublishedRun, ...] = MEGATRON_RUNS + LLAMA3_RUNS

GPT3_TRAINING_DAYS = Published(34, "days to train GPT-3 175B on 300B tokens, 1,024 A100s at 140 TFLOP/s",
                               NARAYANAN + ", section 5.1, eq. (4)")
TRILLION_TRAINING_DAYS = Published(84, "days to train the 1T model on 450B tokens, 3,072 A100s at 163 TFLOP/s",
                                   NARAYANAN + ", section 5.1, eq. (4)")


def narayanan_flops_per_iteration(batch: float, seq_len: int, layers: int, hidden: int, vocab: int) -> float:
    """Eq. (3) of Narayanan et al. 2021: ``96 B s l h^2 (1 + s/6h + V/16lh)``, recomputation included."""
    B, s, l, h, V = float(batch), seq_len, layers, hidden, vocab
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def narayanan_params(layers: int, hidden: int, vocab: int, seq_len: int) -> float:
    """Eq. (2) of Narayanan et al. 2021: ``12 l h^2 (1 + 13/12h + (V + s)/12lh)``, biases and embeddings included."""
    l, h = layers, hidden
    return 12 * l * h * h * (1 + 13 / (12 * h) + (vocab + seq_len) / (12 * l * h))


class Comparison(NamedTuple):
    """One published run next to the planner's prediction for it."""

    run: PublishedRun
    plan: Plan
    predicted_tflops_per_gpu: float

    @property
    def relative_error(self) -> float:
        """``predicted / published - 1``: +0.10 means the planner is 10% optimistic."""
        return self.predicted_tflops_per_gpu / self.run.tflops_per_gpu.value - 1


def compare(runs: tuple[PublishedRun, ...] = PUBLISHED_RUNS, efficiency: float = COMPUTE_EFFICIENCY,
            gemm_quantization: bool = False) -> list[Comparison]:
    """The planner on every run at one ``efficiency``, counting FLOPs as each paper does."""
    out = []
    for run in runs:
        p = plan(run.model, run.cluster, run.layout, efficiency=efficiency, gemm_quantization=gemm_quantization)
        out.append(Comparison(run, p, p.tflops_per_gpu if run.counts_recompute else p.model_tflops_per_gpu))
    return out


def mean_log_error(rows: list[Comparison]) -> float:
    """``mean(log(predicted / published))``: 0 when the planner is right on average (in ratio)."""
    if not rows:
        raise ValueError("rows is empty; pass compare(...) of at least one run")
    return sum(math.log(1 + row.relative_error) for row in rows) / len(rows)


def fit_efficiency(runs: tuple[PublishedRun, ...] = MEGATRON_RUNS, gemm_quantization: bool = False,
                   tol: float = 1e-6) -> float:
    """The efficiency at which :func:`mean_log_error` over ``runs`` is zero (bisection; it rises with efficiency).

    Fit it on one set of runs and score it on another: the chapter fits on
    Megatron's Table 1 (in sample) and scores Llama 3 (out of sample).
    """
    if not runs:
        raise ValueError("runs is empty; pass at least one PublishedRun")
    lo, hi = 0.05, 1.0
    if mean_log_error(compare(runs, efficiency=hi, gemm_quantization=gemm_quantization)) < 0:
        raise ValueError("even efficiency 1.0 under-predicts these runs on average")
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if mean_log_error(compare(runs, efficiency=mid, gemm_quantization=gemm_quantization)) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
