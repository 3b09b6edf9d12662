"""Scorecard rows of part 5's serving models: ``deployment`` (chapter 6) and ``step_time`` (chapter 1).

Both print roofline **bounds**: a real engine should land below them, so a
negative relative error is the expected sign and its size is how far the
engine stays from the roof. ``deployment``: the rows chapter 6 already holds
:func:`utils.serving.many_gpus.published_deployments.hold_against` against (DeepSeek's
Day-6 figures and LMSYS's large-scale EP blog). ``step_time``:
:func:`utils.serving.costs.step_time.serve_batch` and
:func:`~utils.serving.costs.step_time.prefill_seconds` against TensorRT-LLM's
published static-batch throughputs and first-token latencies, whose batch,
lengths, precision and TP the table states. A first-token latency is scored as
the rate it implies (prompt tokens over seconds), so that every row of a
calculator reads the same way: positive error, faster than published.
"""

from __future__ import annotations

from functools import partial

from utils.scorecard.record import Entry
from utils.serving.many_gpus import published_deployments as _deployments
from utils.serving.costs import step_time as _step_time

TRTLLM = ("NVIDIA/TensorRT-LLM, docs/source/performance.md at commit 138f96d4 (data 'updated for v0.6.1, unless "
          "specified'; LLaMA 7B and 70B are Llama-2-7b and Llama-2-70b per its 'Engine Building Setups')")
_DEPLOYMENT_OMITS = ("a roofline bound: expert load imbalance (SGLang's EPLB alone made prefill 1.49x and decode "
                     "2.54x faster), all-to-all latency, kernels below peak, two micro-batches that do not hide "
                     "everything; the bound is network-bound in every row (the 50 GB/s link over the bytes a token "
                     "sends), so it measures the NIC, not the GPU (chapter 6, section 5)")


def _deployment_bound(index: int) -> float:
    return _deployments.hold_against((_deployments.ROWS[index],))[0].bound_per_node


def _deployment_entries() -> list[Entry]:
    out = []
    for i, row in enumerate(_deployments.ROWS):
        layout = row.layout
        out.append(Entry(
            "deployment", row.name, row.tokens_per_s_per_node.source,
            {"model": "DeepSeek-V3", "phase": row.phase, "ep": layout.ep, "batch_per_gpu": row.batch_per_gpu,
             "context": row.context, "tokens_per_step": layout.tokens_per_step,
             "accepted_per_step": layout.accepted_per_step, "weight_bytes": layout.weight_bytes,
             "gpu": "H100-SXM (for the H800 too)", "production": row.production},
            f"{row.phase} tokens/s per node", "tokens/s per node", row.tokens_per_s_per_node.value,
            partial(_deployment_bound, i), "holdout",
            _DEPLOYMENT_OMITS + ("; a 24-hour production average with quiet hours, batch by Little's law"
                                 if row.production else "")))
    return out


def _throughput(model: str, precision: str, gpu: str, tp: int, batch: int, prompt: int, output: int) -> float:
    bytes_per = 1 if precision == "fp8" else 2
    served = _step_time.served_model(model, weight_bytes_per_param=bytes_per, kv_bytes_per_elem=bytes_per)
    roof = _step_time.Roof.of(gpu, precision, n_chips=tp)
    return _step_time.serve_batch(served, roof, batch, prompt, output).tokens_per_s / tp


def _prefill_rate(model: str, precision: str, gpu: str, tp: int, prompt: int) -> float:
    """Prompt tokens per second of one request's prefill: ``prompt / TTFT``, TTFT by :func:`prefill_seconds`."""
    bytes_per = 1 if precision == "fp8" else 2
    served = _step_time.served_model(model, weight_bytes_per_param=bytes_per, kv_bytes_per_elem=bytes_per)
    return prompt / _step_time.prefill_seconds(served, prompt, _step_time.Roof.of(gpu, precision, n_chips=tp))


_STEP_OMITS = ("a roofline bound: kernels below peak, launches, sampling, activations and the KV-cache writes; "
               "tensor parallelism priced as ideal (no all-reduce)")
_THROUGHPUT = (  # table, model, precision, gpu, TP, batch, input, output, out tok/s (per GPU)
    ("'Peak Throughput', 'A100 GPUs (FP16)'", "LLaMA-2-7B", "fp16", "A100-SXM4-80GB", 1, 384, 128, 128, 5586),
    ("'Peak Throughput', 'A100 GPUs (FP16)'", "LLaMA-2-7B", "fp16", "A100-SXM4-80GB", 1, 60, 128, 2048, 1928),
    ("'Peak Throughput', 'A100 GPUs (FP16)'", "LLaMA-2-7B", "fp16", "A100-SXM4-80GB", 1, 52, 2048, 128, 591),
    ("'Peak Throughput', 'H100 GPUs (FP8)'", "LLaMA-2-7B", "fp8", "H100-SXM", 1, 768, 128, 128, 19694),
    ("'Peak Throughput', 'H100 GPUs (FP8)'", "LLaMA-2-7B", "fp8", "H100-SXM", 1, 112, 128, 2048, 6818),
    ("'Peak Throughput', 'H100 GPUs (FP8)'", "LLaMA-2-7B", "fp8", "H100-SXM", 1, 80, 2048, 128, 2244),
    ("'Peak Throughput', 'H100 GPUs (FP8)'", "LLaMA-2-7B", "fp8", "H100-SXM", 1, 48, 2048, 2048, 2740),
    ("'Peak Throughput', 'H100 GPUs (FP8)'", "LLaMA-2-70B", "fp8", "H100-SXM", 2, 1024, 128, 128, 2657),
    ("'Peak Throughput', 'H100 GPUs (FP8)'", "LLaMA-2-70B", "fp8", "H100-SXM", 4, 480, 128, 2048, 1486),
    ("'Peak Throughput', 'H100 GPUs (FP8)'", "LLaMA-2-70B", "fp8", "H100-SXM", 2, 96, 2048, 128, 306),
    ("'Peak Throughput', 'H100 GPUs (FP8)'", "LLaMA-2-70B", "fp8", "H100-SXM", 2, 64, 2048, 2048, 547),
)
"""The A100 rows with TP > 1 are left out: that table's unit, 'out tok/s', does not say whether it is per GPU."""
_FIRST_TOKEN = (  # table (TensorRT-LLM v0.5), model, precision, gpu, TP, input, first-token latency in ms
    ("'Low Latency', 'A100 GPUs (FP16)'", "LLaMA-2-7B", "fp16", "A100-SXM4-80GB", 1, 128, 16),
    ("'Low Latency', 'A100 GPUs (FP16)'", "LLaMA-2-7B", "fp16", "A100-SXM4-80GB", 1, 2048, 133),
    ("'Low Latency', 'A100 GPUs (FP16)'", "LLaMA-2-70B", "fp16", "A100-SXM4-80GB", 4, 128, 47),
    ("'Low Latency', 'A100 GPUs (FP16)'", "LLaMA-2-70B", "fp16", "A100-SXM4-80GB", 4, 2048, 377),
    ("'Low Latency', 'H100 GPUs (FP8)'", "LLaMA-2-7B", "fp8", "H100-SXM", 1, 128, 7),
    ("'Low Latency', 'H100 GPUs (FP8)'", "LLaMA-2-7B", "fp8", "H100-SXM", 1, 2048, 36),
    ("'Low Latency', 'H100 GPUs (FP8)'", "LLaMA-2-70B", "fp8", "H100-SXM", 4, 128, 26),
    ("'Low Latency', 'H100 GPUs (FP8)'", "LLaMA-2-70B", "fp8", "H100-SXM", 4, 2048, 109),
)


def _step_time_entries() -> list[Entry]:
    out = []
    for table, model, precision, gpu, tp, batch, prompt, output, published in _THROUGHPUT:
        fp8 = "; FP8 weights, KV cache and GEMMs (the model's fp8 roof)" if precision == "fp8" else ""
        out.append(Entry(
            "step_time", f"TensorRT-LLM {model} {precision.upper()}, {gpu}, TP {tp}, batch {batch}, {prompt} in / "
            f"{output} out", f"{TRTLLM}, {table}",
            {"model": model, "precision": precision, "gpu": gpu, "tp": tp, "batch": batch, "input_len": prompt,
             "output_len": output}, "output throughput of a static batch (prefill, then decode)",
            "output tokens/s per GPU", published,
            partial(_throughput, model, precision, gpu, tp, batch, prompt, output), "holdout", _STEP_OMITS + fp8))
    for table, model, precision, gpu, tp, prompt, ms in _FIRST_TOKEN:
        out.append(Entry(
            "step_time", f"TensorRT-LLM {model} {precision.upper()}, {gpu}, TP {tp}, first token of a {prompt}-token "
            "prompt", f"{TRTLLM}, {table} (TensorRT-LLM v0.5, batch 1): {ms} ms, as {prompt} tokens / {ms} ms",
            {"model": model, "precision": precision, "gpu": gpu, "tp": tp, "batch": 1, "input_len": prompt,
             "first_token_latency_ms": ms},
            "prefill rate of one prompt (prompt tokens over the first-token latency)", "prompt tokens/s",
            prompt / (ms / 1e3), partial(_prefill_rate, model, precision, gpu, tp, prompt), "holdout",
            _STEP_OMITS + "; at 128 tokens the prefill is weight-bound and launch latency dominates"))
    return out


def entries() -> list[Entry]:
    """The deployment rows of chapter 6 and the step-time rows from TensorRT-LLM's tables."""
    return _deployment_entries() + _step_time_entries()
