"""Scorecard rows of the training planner (part 2, chapter 13): ``planner``, ``planner_5d`` and ``planner_memory``.

``planner``: :func:`utils.parallel.planning.planner.plan`'s throughput against
published runs. Megatron-LM's Table 1 is the ``fit`` split (the planner's one
constant, ``COMPUTE_EFFICIENCY`` = 0.52, was fitted on those ten rows alone:
chapter 13, section 5); everything else is ``holdout``. ``planner_5d``:
:mod:`utils.parallel.planning.planner_5d` (context and expert parallelism).
``planner_memory``: the planner's bytes per GPU against the peak memory a run
reports. Every prediction reads ``COMPUTE_EFFICIENCY`` when it is computed, so
refitting the constant moves every row.

Inputs the sources do not print are stated as assumptions in each row
(``inputs`` names them, ``omits`` says what the model cannot express).
"""

from __future__ import annotations

from functools import partial

from utils.parallel.planning import planner as _planner
from utils.parallel.planning import published_runs as _runs
from utils.parallel.planning import published_runs_5d as _runs_5d
from utils.parallel.planning.planner import Cluster, Layout, Model
from utils.scorecard.record import Entry

TFLOPS = "TFLOP/s per GPU"
TOKENS = "tokens/s per GPU"

# --- published inputs that are not the book's tables yet -------------------------------------------------------

TT_A100 = ("pytorch/torchtitan, docs/performance.md at commit 1ea476e9f (2024-04-24), Llama 3 and Llama 2 tables "
           "(FSDP2 on 64 A100 80GB); sequence length and model shapes from train_configs/*.toml and "
           "torchtitan/models/llama/__init__.py at the same commit")
TT_405B_2D = ("pytorch/torchtitan, docs/performance.md at commit 4d88a8a44 (2024-12-03), 'Llama 3.1 performance "
              "numbers' (405B, 128 H100 94GB, FSDP 16 x TP 8), row 'None'; seq_len from train_configs/llama3_405b.toml")
TT_H100 = ("pytorch/torchtitan, docs/performance.md at commit d4c86e375 (2025-01-30; unchanged at eaea6f6), "
           "Grand Teton H100 96GB HBM2e, 500 W, 400 Gb/s per GPU; seq_len 8192 from train_configs/*.toml at 9dec370")
BLOOM = ("bigscience-workshop/bigscience, train/tr11-176B-ml/README.md at commit 9e64edec (BLOOM-176B): "
         "'Replica setup', 'Hardware', model shape, and the log line of iteration 85376 (104.70 s per iteration)")
LLAMA3_TABLE3 = "Llama 3 paper (arXiv:2407.21783), Table 3"

LLAMA3_8B = Model(32, 4096, 32, 128_000, 8192, ffn=14_336, kv_heads=8, gated_ffn=True, tied_embeddings=False,
                  name="Llama 3 8B")
LLAMA3_70B = Model(80, 8192, 64, 128_000, 8192, ffn=28_672, kv_heads=8, gated_ffn=True, tied_embeddings=False,
                   name="Llama 3 70B")
LLAMA2_13B = Model(40, 5120, 40, 32_000, 4096, ffn=13_824, gated_ffn=True, tied_embeddings=False, name="Llama 2 13B")
LLAMA2_70B = Model(80, 8192, 64, 32_000, 4096, ffn=28_672, kv_heads=8, gated_ffn=True, tied_embeddings=False,
                   name="Llama 2 70B")
BLOOM_176B = Model(70, 14_336, 112, 250_880, 2048, name="BLOOM-176B")
"""70 layers, hidden 14,336, 112 heads, GELU MLP of 4h, tied embeddings, padded vocabulary 250,880 (the README)."""
OPA_BYTES_PER_S = 4 * 100e9 / 8 / 8
"""Four Omni-Path links per 8-GPU node (the README); 100 Gb/s per link, OPA's line rate, is assumed."""

_FSDP = dict(tp=1, pp=1, zero_stage=3, grad_bytes=4)  # FSDP2 with reduce_dtype float32 (torchtitan's default)
_COMMON_OMITS = ("one GEMM efficiency fitted on 2021 A100 GPT runs; a GPT layer's activations (dropout, 4h GELU); "
                 "DP traffic over NCCL's rings, hidden behind one micro-batch's pass, with no NCCL kernels taking "
                 "SMs from the GEMMs")


def _plan(model: Model, cluster: Cluster, layout: Layout) -> _planner.Plan:
    return _planner.plan(model, cluster, layout, efficiency=_planner.COMPUTE_EFFICIENCY)


def _tokens_per_gpu(model: Model, cluster: Cluster, layout: Layout) -> float:
    p = _plan(model, cluster, layout)
    return p.tokens_per_s / p.n_gpus


def _memory_gib(model: Model, cluster: Cluster, layout: Layout) -> float:
    return _plan(model, cluster, layout).memory_bytes / 2**30


def _inputs(model: Model, cluster: Cluster, layout: Layout, **extra: object) -> dict[str, object]:
    fields = {k: getattr(layout, k) for k in ("dp", "tp", "pp", "v", "micro_batch", "global_batch", "zero_stage",
                                              "sequence_parallel", "recompute", "grad_bytes")}
    return {"model": model.name, "seq_len": model.seq_len, "gpu": cluster.gpu, "n_gpus": cluster.n_gpus,
            "nic_bytes_per_s": cluster.nic_bandwidth, **fields, **extra}


def _compare(run: _runs.PublishedRun) -> float:
    return _runs.compare((run,), efficiency=_planner.COMPUTE_EFFICIENCY)[0].predicted_tflops_per_gpu


def _published_run_entries() -> list[Entry]:
    out = []
    for run in _runs.MEGATRON_RUNS + _runs.LLAMA3_RUNS:
        fit = run in _runs.MEGATRON_RUNS
        source = run.tflops_per_gpu.source + (f"; micro-batch and v from {_runs.MEGATRON_SCRIPT}" if fit else
                                              "; layout as chapter 13 reads section 3.3.2 (v = 8, ZeRO-2, fp32 grads)")
        omits = ("fitted row: COMPUTE_EFFICIENCY is chosen so the ten Table 1 rows have zero mean log error; "
                 "in-sample errors trend from +18% (1.7B) to -15% (1T): non-matmul time falls as 1/h"
                 if fit else "Llama 3's tunable N of micro-batches in flight, the causal "
                 "discount of attention FLOPs (7.7% of model FLOPs at 8K), a Llama layer's activations"
                 + ("; the planner's memory says this row does not fit (GPT-layer activations, interleaving)"
                    if run.cluster.n_gpus == 8192 else ""))
        out.append(Entry("planner", run.name, source,
                         _inputs(run.model, run.cluster, run.layout,
                                 flops="eq. (3), recomputation included" if run.counts_recompute else "model FLOPs"),
                         "TFLOP/s per GPU" + (" (Narayanan eq. 3)" if run.counts_recompute else " (model FLOPs)"),
                         TFLOPS, run.tflops_per_gpu.value, partial(_compare, run), "fit" if fit else "holdout",
                         omits))
    return out


def _five_d_entries() -> list[Entry]:
    llama = Entry("planner_5d", "Llama 3 405B, 128K context, TP 8 x CP 16 x PP 16 x DP 8",
                  _runs_5d.LLAMA3_128K_TFLOPS.source,
                  _inputs(_runs_5d.LLAMA3_128K, _runs_5d.LLAMA3_128K_CLUSTER, _runs_5d.LLAMA3_128K_LAYOUT, cp=16),
                  "TFLOP/s per GPU (model FLOPs)", TFLOPS, _runs_5d.LLAMA3_128K_TFLOPS.value,
                  lambda: _runs_5d.llama3_128k_row(efficiency=_planner.COMPUTE_EFFICIENCY).predicted, "holdout",
                  "K/V all-gather Llama 3 exposes (+2% of the step, error -3.4% -> -5.4%); the FLOP convention: "
                  "full s x s scores counted and computed (57% of model FLOPs at 128K); kernels that skip the masked "
                  "half with the count halved give 376, mixing conventions gives 262 or 527 (chapter 13, section 7)")

    def deepseek() -> float:
        row = _runs_5d.deepseek_v3_row(ep_overlap=1.0, efficiency=_planner.COMPUTE_EFFICIENCY,
                                       max_nodes=_runs_5d.DSV3_MAX_NODES, dispatch_bytes=_runs_5d.DSV3_DISPATCH_BYTES)
        return 1e12 / (row.predicted * 3600)

    layout = _runs_5d.DSV3_LAYOUT
    dsv3 = Entry("planner_5d", "DeepSeek-V3 pre-training, PP 16 x EP 64 x DP 128 (ZeRO-1), all-to-alls hidden",
                 _runs_5d.DSV3_GPU_HOURS_PER_T.source + ": 180K H800 GPU-hours per trillion tokens, as 10^12 / "
                 "(180e3 x 3600) tokens/s per GPU",
                 {"model": "DeepSeek-V3", "gpu": "H100-SXM for the H800", "n_gpus": layout.n_gpus, "pp": layout.pp,
                  "ep": layout.ep, "dp": layout.dp, "tp": layout.tp, "micro_batch": layout.micro_batch,
                  "global_batch": layout.global_batch, "seq_len": layout.seq_len, "ep_overlap": 1.0,
                  "max_nodes": _runs_5d.DSV3_MAX_NODES, "dispatch_bytes": _runs_5d.DSV3_DISPATCH_BYTES},
                 "training tokens/s per GPU", TOKENS, 1e12 / (_runs_5d.DSV3_GPU_HOURS_PER_T.value * 3600), deepseek,
                 "holdout", "FP8 GEMMs (78% of the FLOPs in linear layers: 1.3x to 2x faster would make the planner "
                 "25% to 65% optimistic instead of 3%); DualPipe's smaller bubble (1F1B's is 11% of the step); "
                 "20 of 132 SMs kept for communication; the MTP module; the batch ramp over the first 469B tokens. "
                 "Omissions in both directions cancel: the agreement is not evidence of accuracy (chapter 13)")
    return [llama, dsv3]


def _row(run: str, source: str, model: Model, cluster: Cluster, layout: Layout, published: float, omits: str,
         assumed: str) -> Entry:
    return Entry("planner", run, source, _inputs(model, cluster, layout, assumed=assumed), "training throughput",
                 TOKENS, published, partial(_tokens_per_gpu, model, cluster, layout), "holdout",
                 f"{omits}; {_COMMON_OMITS}")


def _torchtitan_a100() -> list[Entry]:
    cluster = Cluster("A100-SXM4-80GB", 64, nvlink_domain=8, nic_bandwidth=25e9)
    assumed = "200 Gb/s per GPU (the doc does not give the network); recompute mapped to the planner's kinds"
    rows = (  # model, local batch, torchtitan's AC, planner's recompute, published tokens/s per GPU
        (LLAMA3_8B, 1, "selective layer", "selective", 2904), (LLAMA3_8B, 1, "selective op", "selective", 2973),
        (LLAMA3_70B, 1, "full", "full", 331), (LLAMA2_13B, 2, "no", "none", 2162),
        (LLAMA2_13B, 2, "selective layer", "selective", 1914), (LLAMA2_13B, 2, "selective op", "selective", 1904),
        (LLAMA2_70B, 1, "selective op", "selective", 355), (LLAMA2_70B, 2, "full", "full", 353))
    out = []
    for model, b, ac, recompute, tps in rows:
        layout = Layout(dp=64, micro_batch=b, global_batch=64 * b, recompute=recompute, **_FSDP)
        what = {"selective layer": "layer-level AC of every other layer (recomputes half the layers' forward)",
                "selective op": "op-level selective AC (keeps matmul outputs)", "no": "no AC",
                "full": "full AC"}[ac]
        omits = (f"{what}, which the planner prices as recompute={recompute!r}; FlashAttention (the planner "
                 f"stores Korthikanti's attention scores unless recompute is selective or full)")
        out.append(_row(f"torchtitan FSDP2, {model.name}, 64 A100, local batch {b}, AC {ac}", TT_A100, model,
                        cluster, layout, tps, omits, assumed))
    return out


def _torchtitan_h100() -> list[Entry]:
    out = []
    for gpus, table, rows in ((8, "Table 1", ((5762, 82.4, ""), (6667, 77.0, "torch.compile"),
                                              (8532, None, "torch.compile + Float8"))),
                              (128, "Table 3", ((5605, 67.0, ""), (6514, 62.0, "torch.compile"),
                                                (8380, None, "torch.compile + Float8")))):
        cluster = Cluster("H100-SXM", gpus, nvlink_domain=8, nic_bandwidth=50e9)
        layout = Layout(dp=gpus, micro_batch=2, global_batch=2 * gpus, recompute="selective", **_FSDP)
        for tps, gib, extra in rows:
            name = f"torchtitan FSDP2, Llama 3.1 8B, {gpus} H100, local batch 2{', ' + extra if extra else ''}"
            omits = ("the 500 W power cap (peak between SXM and NVL: the doc's footnote 2); op-level selective AC; "
                     + (f"{extra} (the same layout, one prediction)" if extra else "nothing else named by the doc"))
            source = f"{TT_H100}, {table}"
            out.append(_row(name, source, LLAMA3_8B, cluster, layout, tps, omits, "H100-SXM's 80 GB spec"))
            if gib is not None:
                out.append(Entry("planner_memory", name, source, _inputs(LLAMA3_8B, cluster, layout),
                                 "peak memory per GPU", "GiB", gib, partial(_memory_gib, LLAMA3_8B, cluster, layout),
                                 "holdout", "a GPT layer's activations (dropout masks, 4h GELU MLP, full K/V heads) "
                                 "for a Llama layer; no CUDA context, NCCL buffers or allocator cache; FSDP2's fp32 master "
                                 "weights and transient bf16 gathers counted as 2 + 4 + 12 bytes per parameter"
                                 + (f"; {extra} (lowers the published memory)" if extra else "")))
    # Table 4: 70B, FSDP 32 x TP 8; Table 5: 405B, FSDP 8 x TP 8 x PP 8 (all with torch.compile and Float8)
    c70 = Cluster("H100-SXM", 256, nvlink_domain=8, nic_bandwidth=50e9)
    l70 = Layout(dp=32, tp=8, pp=1, micro_batch=16, global_batch=512, zero_stage=3, sequence_parallel=True,
                 recompute="full", grad_bytes=4)
    for tps, extra in ((829, ""), (876, " + AsyncTP")):
        out.append(_row(f"torchtitan 2D (FSDP 32 x TP 8), Llama 3.1 70B, 256 H100{extra}", f"{TT_H100}, Table 4",
                        LLAMA3_70B, c70, l70, tps, f"torch.compile and Float8 GEMMs{extra}; 500 W power cap",
                        "sequence parallelism with TP; no gradient accumulation (micro-batch = local batch 16)"))
    c405 = Cluster("H100-SXM", 512, nvlink_domain=8, nic_bandwidth=50e9)
    l405 = Layout(dp=8, tp=8, pp=8, micro_batch=4, global_batch=256, zero_stage=3, sequence_parallel=True,
                  recompute="full", balance_embedding=True, grad_bytes=4)
    out.append(_row("torchtitan 3D (FSDP 8 x TP 8 x PP 8), Llama 3.1 405B, 512 H100, 1F1B", f"{TT_H100}, Table 5",
                    _runs.LLAMA3_405B, c405, l405, 100, "torch.compile, Float8 GEMMs and AsyncTP; 500 W power cap; "
                    "126 layers split over 8 stages as torchtitan splits them (the planner needs 126 + 2 slots)",
                    "8 micro-batches of 4 per step (torchtitan's default: one per stage); embedding and output "
                    "layer each take a layer's slot"))
    c2d = Cluster("H100-SXM", 128, nvlink_domain=8, nic_bandwidth=50e9)
    l2d = Layout(dp=16, tp=8, pp=1, micro_batch=2, global_batch=32, zero_stage=3, sequence_parallel=True,
                 recompute="full", grad_bytes=4)
    out.append(_row("torchtitan 2D (FSDP 16 x TP 8), Llama 3.1 405B, 128 H100, BF16", TT_405B_2D, _runs.LLAMA3_405B,
                    c2d, l2d, 109, "torch.compile (on in that commit's config; the doc's row says no Float8 or "
                    "AsyncTP); H100 94GB with an unstated clock", "400 Gb/s per GPU (stated only in the later doc)"))
    return out


def _bloom() -> Entry:
    cluster = Cluster("A100-SXM4-80GB", 384, nvlink_domain=8, nic_bandwidth=OPA_BYTES_PER_S)
    layout = Layout(dp=8, tp=4, pp=12, micro_batch=2, global_batch=2048, zero_stage=1, recompute="full",
                    balance_embedding=True)
    return _row("BLOOM-176B (Megatron-DeepSpeed), 384 A100, TP 4 x PP 12 x DP 8", BLOOM, BLOOM_176B, cluster, layout,
                2048 * 2048 / (104.70 * 384), "ALiBi and the embedding LayerNorm; DeepSpeed's pipeline engine "
                "(not Megatron's interleaving: v = 1); 16-bit gradients assumed", "100 Gb/s per Omni-Path link; "
                "the embedding layers counted as pipeline slots (--pp-partition-method 'type:transformer|embedding')")


def entries() -> list[Entry]:
    """Every training row: the published runs of chapter 13, the five-dimensional rows, and the new holdouts."""
    return (_published_run_entries() + _five_d_entries() + _torchtitan_a100() + _torchtitan_h100() + [_bloom()])

