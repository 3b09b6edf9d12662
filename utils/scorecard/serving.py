"""Scorecard rows of part 5's serving models: ``deployment`` (chapter 6), ``step_time`` (chapter 1) and
``serving_calibrated`` beside it.

The first two print roofline **bounds**: a real engine should land below
them, so every row is scored as a rate and a positive relative error is the
expected sign, its size how far the engine stays from the roof. A latency is
scored as the rate it implies (prompt tokens over the first-token latency; one
token over the inter-token latency).

- ``deployment``: the rows chapter 6 already holds
  :func:`utils.serving.many_gpus.published_deployments.hold_against` against
  (DeepSeek's Day-6 figures and LMSYS's large-scale EP blog).
- ``step_time``: :func:`utils.serving.costs.step_time.serve_batch` and
  :func:`~utils.serving.costs.step_time.prefill_seconds` against TensorRT-LLM
  0.5/0.6's static-batch throughputs and first-token latencies, whose batch,
  lengths, precision and TP the tables state; then TensorRT-LLM 1.0's
  maximum-throughput table and one NIM latency-throughput table, priced as
  continuous batching at steady state
  (:func:`utils.serving.costs.calibrated.continuous` with every fraction at 1).
- ``serving_calibrated``: the same published figures against the calibrated
  prediction (:mod:`utils.serving.costs.calibrated`), each phase's roofline time
  over the fraction of the roof engines reach, fitted on the rows marked
  ``fit`` alone (:func:`calibration_fit`): an estimate, not a bound.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple

from utils.gpu import hardware as _hardware
from utils.scorecard.record import Entry
from utils.serving.costs import calibrated as _calibrated
from utils.serving.costs import step_time as _step_time
from utils.serving.many_gpus import published_deployments as _deployments

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


def _served(model: str, precision: str) -> _step_time.ServedModel:
    bytes_per = 1 if precision == "fp8" else 2
    return _step_time.served_model(model, weight_bytes_per_param=bytes_per, kv_bytes_per_elem=bytes_per)


def _throughput(model: str, precision: str, gpu: str, tp: int, batch: int, prompt: int, output: int) -> float:
    roof = _step_time.Roof.of(gpu, precision, n_chips=tp)
    return _step_time.serve_batch(_served(model, precision), roof, batch, prompt, output).tokens_per_s / tp


def _prefill_rate(model: str, precision: str, gpu: str, tp: int, prompt: int) -> float:
    """Prompt tokens per second of one request's prefill: ``prompt / TTFT``, TTFT by :func:`prefill_seconds`."""
    return prompt / _step_time.prefill_seconds(_served(model, precision), prompt,
                                               _step_time.Roof.of(gpu, precision, n_chips=tp))


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


TRTLLM_V1 = ("NVIDIA/TensorRT-LLM, docs/source/performance/perf-overview.md at commit 00f37686 (v1.0), "
             "'Throughput Measurements': 'Total Output Throughput (tokens/sec)' of trtllm-bench's offline "
             "maximum-throughput run, PyTorch backend, CUDA graphs up to batch 8192; ModelOpt FP8 checkpoints; "
             "'H100 SXM 80GB (DGX H100)', 'H200 SXM 141GB (DGX H200)'")
_V1_SHAPES = ((128, 128), (128, 2048), (128, 4096), (500, 2000), (1000, 1000), (1000, 2000), (2048, 128),
              (2048, 2048), (5000, 500), (20000, 2000))
_V1_THROUGHPUT = (  # table, model, GPU, TP, total output tokens/s for each of _V1_SHAPES (ISL/OSL)
    ("Llama 3.1 8B", "Llama-3-8B", "H100-SXM", 1,
     (28312, 22714, 14325, 17660, 15220, 13899, 3450, 9305, 3459, 1351)),
    ("Llama 3.1 8B", "Llama-3-8B", "H200", 1,
     (27911, 26221, 18027, 20770, 17744, 16828, 3538, 12194, 3902, 1804)),
    ("Llama 3.3 70B", "Llama-3-70B", "H200", 1, (3803, 4336, 2872, 3666, 2909, 2994, 442, 2003, 566, 283)),
    ("Llama 3.3 70B", "Llama-3-70B", "H100-SXM", 2, (6378, 6651, 4199, 5222, 4205, 4146, 762, 3082, 898, 437)),
)
"""Llama 3.1 8B and 3.3 70B have Llama 3's 8B and 70B shapes (the book's ``Llama-3-8B``, ``Llama-3-70B``)."""
_V1_FIT = ("Llama 3.1 8B", "H100-SXM")
"""The column the calibration is fitted on; the other three, and every other serving row, are holdout."""

NIM = ("NVIDIA NIM benchmarking guide, LLM 1.0.0, 'Performance' (docs.nvidia.com/nim/benchmarking/llm/1.0.0/"
       "performance.md): 'Llama-3.3-70b-instruct Results', 'Version: 1.8.0', '2 x H100 80G', 'fp8 TP2', "
       "'5000 Input Tokens / 500 Output Tokens'")
_NIM_ROWS = (  # concurrency, TTFT ms, ITL ms, throughput tokens/s, as printed
    (1, 406.77, 18.58, 51.67), (5, 546.7, 21.83, 218.48), (25, 688.69, 38.75, 623.4), (50, 834.51, 59.73, 814.37),
    (100, 7996.25, 92.91, 917.26), (150, 34794.22, 92.86, 920.9), (200, 61680.22, 93.06, 920.54),
    (250, 88605.32, 93.2, 920.12))
_NIM_FIT_CONCURRENCY = 1
"""The one latency-bound decode row the calibration is fitted on (its ITL)."""

_KV_ASSUMPTION = ("FP8 KV cache assumed (ModelOpt's FP8 checkpoints; with a BF16 cache the published throughput "
                  "beats the roofline bound on 26 of the 40 TensorRT-LLM 1.0 rows, so the engines cannot have "
                  "used one); KV memory 0.9 of what the weights leave, batch at most 2048")
_NIM_ASSUMPTIONS = ("'H100 80G' read as H100 SXM (the page's hardware section could not be opened; an H100 PCIe's "
                    "2.0 TB/s would make every time here 1.7x longer); " + _KV_ASSUMPTION)
_CALIBRATED_OMITS = ("the fraction of the roof reached by phase is fitted, not explained: kernels below peak, "
                     "launches, sampling and scheduling; TP all-reduces left out; prefill priced apart from the "
                     "decodes it shares steps with; no queueing")


def _continuous(model: str, gpu: str, tp: int, prompt: int, output: int, concurrency: int | None, field: str,
                achieved: "_calibrated.Achieved | None" = None) -> float:
    point = _calibrated.continuous(_served(model, "fp8"), _step_time.Roof.of(gpu, "fp8", n_chips=tp),
                                   tp * _hardware.spec(gpu).hbm_bytes, prompt, output, concurrency,
                                   achieved=_calibrated.ACHIEVED if achieved is None else achieved)
    return getattr(point, field)


def _static_calibrated(model: str, precision: str, gpu: str, tp: int, batch: int, prompt: int, output: int,
                       achieved: "_calibrated.Achieved | None" = None) -> float:
    roof = _step_time.Roof.of(gpu, precision, n_chips=tp)
    return _calibrated.static_batch(_served(model, precision), roof, batch, prompt, output,
                                    _calibrated.ACHIEVED if achieved is None else achieved).tokens_per_s / tp


def _prefill_calibrated(model: str, precision: str, gpu: str, tp: int, prompt: int,
                        achieved: "_calibrated.Achieved | None" = None) -> float:
    a = _calibrated.ACHIEVED if achieved is None else achieved
    seconds = _step_time.prefill_seconds(_served(model, precision), prompt, _step_time.Roof.of(gpu, precision, tp))
    return prompt / (seconds / a.check().prefill)


class _Row(NamedTuple):
    """One published serving figure, and how the bound and the calibrated model predict it."""

    run: str
    source: str
    inputs: dict
    quantity: str
    unit: str
    published: float
    predict: Callable[..., float]  # takes achieved= (ROOF for the bound)
    fit: bool
    omits: str


def _serving_rows() -> list[_Row]:
    out = []
    for table, model, gpu, tp, values in _V1_THROUGHPUT:
        for (prompt, output), published in zip(_V1_SHAPES, values):
            out.append(_Row(
                f"TensorRT-LLM 1.0 {table} FP8, {gpu}, TP {tp}, {prompt} in / {output} out, max throughput",
                f"{TRTLLM_V1}, table '{table}', column '{gpu.split('-')[0]} TP{tp} (FP8)', row '{prompt}/{output}'",
                {"model": model, "precision": "fp8", "gpu": gpu, "tp": tp, "input_len": prompt, "output_len": output,
                 "concurrency": "offline (as many as fit)", "kv_cache": "fp8 (assumed)"},
                "output throughput of continuous batching at the largest batch that fits",
                "output tokens/s (all GPUs)", published,
                partial(_continuous, model, gpu, tp, prompt, output, None, "tokens_per_s"),
                (table, gpu) == _V1_FIT, _KV_ASSUMPTION))
    for concurrency, ttft, itl, throughput in _NIM_ROWS:
        inputs = {"model": "Llama-3-70B", "precision": "fp8", "gpu": "H100-SXM (assumed)", "tp": 2,
                  "input_len": 5000, "output_len": 500, "concurrency": concurrency, "kv_cache": "fp8 (assumed)"}
        name = f"NIM 1.8.0 Llama 3.3 70B FP8, 2 H100, TP 2, 5000 in / 500 out, concurrency {concurrency}"
        out.append(_Row(f"{name}: ITL", f"{NIM}, row 'Concurrency {concurrency}', 'ITL (ms)': {itl} ms, as "
                        f"1 token / {itl} ms", inputs, "decode rate one request sees (1 / mean inter-token latency)",
                        "tokens/s per request", 1e3 / itl,
                        lambda achieved, c=concurrency: 1 / _continuous("Llama-3-70B", "H100-SXM", 2, 5000, 500, c,
                                                                        "itl", achieved),
                        concurrency == _NIM_FIT_CONCURRENCY, _NIM_ASSUMPTIONS))
        out.append(_Row(f"{name}: throughput", f"{NIM}, row 'Concurrency {concurrency}', 'Throughput(Tokens/s)'",
                        inputs, "output throughput", "output tokens/s (all GPUs)", throughput,
                        partial(_continuous, "Llama-3-70B", "H100-SXM", 2, 5000, 500, concurrency, "tokens_per_s"),
                        False, _NIM_ASSUMPTIONS + "; a client-side measurement over whole requests"))
    out.append(_Row("NIM 1.8.0 Llama 3.3 70B FP8, 2 H100, TP 2, first token of a 5000-token prompt, concurrency 1",
                    f"{NIM}, row 'Concurrency 1', 'TTFT (ms)': 406.77 ms, as 5000 tokens / 406.77 ms",
                    {"model": "Llama-3-70B", "precision": "fp8", "gpu": "H100-SXM (assumed)", "tp": 2,
                     "input_len": 5000, "concurrency": 1, "first_token_latency_ms": 406.77},
                    "prefill rate of one prompt (prompt tokens over the first-token latency)", "prompt tokens/s",
                    5000 / 0.40677, lambda achieved: _prefill_calibrated("Llama-3-70B", "fp8", "H100-SXM", 2, 5000,
                                                                         achieved),
                    False, _NIM_ASSUMPTIONS + "; TTFT includes the HTTP round trip and tokenisation"))
    return out


def _calibrated_entries() -> list[Entry]:
    """The serving_calibrated rows: every step_time row, and the newer rows, over the fitted fractions."""
    out = []
    for table, model, precision, gpu, tp, batch, prompt, output, published in _THROUGHPUT:
        out.append(Entry(
            "serving_calibrated", f"TensorRT-LLM {model} {precision.upper()}, {gpu}, TP {tp}, batch {batch}, "
            f"{prompt} in / {output} out", f"{TRTLLM}, {table}",
            {"model": model, "precision": precision, "gpu": gpu, "tp": tp, "batch": batch, "input_len": prompt,
             "output_len": output}, "output throughput of a static batch (prefill, then decode)",
            "output tokens/s per GPU", published,
            partial(_static_calibrated, model, precision, gpu, tp, batch, prompt, output), "holdout",
            _CALIBRATED_OMITS + "; TensorRT-LLM 0.6 (2023), two years before the rows the fractions come from"))
    for table, model, precision, gpu, tp, prompt, ms in _FIRST_TOKEN:
        out.append(Entry(
            "serving_calibrated", f"TensorRT-LLM {model} {precision.upper()}, {gpu}, TP {tp}, first token of a "
            f"{prompt}-token prompt", f"{TRTLLM}, {table} (TensorRT-LLM v0.5, batch 1): {ms} ms",
            {"model": model, "precision": precision, "gpu": gpu, "tp": tp, "batch": 1, "input_len": prompt,
             "first_token_latency_ms": ms},
            "prefill rate of one prompt (prompt tokens over the first-token latency)", "prompt tokens/s",
            prompt / (ms / 1e3), partial(_prefill_calibrated, model, precision, gpu, tp, prompt), "holdout",
            _CALIBRATED_OMITS + "; a 128-token prompt alone is weight-bound, not the compute-bound prefill the "
            "fraction was fitted on"))
    for row in _serving_rows():
        out.append(Entry("serving_calibrated", row.run, row.source, row.inputs, row.quantity, row.unit,
                         row.published, partial(row.predict, achieved=None), "fit" if row.fit else "holdout",
                         _CALIBRATED_OMITS + "; " + row.omits))
    return out


def _bound_entries() -> list[Entry]:
    """The newer rows held against the roofline bound itself (``step_time``)."""
    return [Entry("step_time", row.run, row.source, row.inputs, row.quantity, row.unit, row.published,
                  partial(row.predict, achieved=_calibrated.ROOF), "holdout", _STEP_OMITS + "; " + row.omits)
            for row in _serving_rows()]


def calibration_fit() -> "_calibrated.Achieved":
    """Refit :data:`utils.serving.costs.calibrated.ACHIEVED` on exactly the ``serving_calibrated`` fit rows."""
    fit = [row for row in _serving_rows() if row.fit]
    return _calibrated.fit_achieved(lambda a: [row.predict(achieved=a) for row in fit], [row.published for row in fit])


def entries() -> list[Entry]:
    """The deployment rows of chapter 6, the step-time bounds, and the calibrated predictions beside them."""
    return _deployment_entries() + _step_time_entries() + _bound_entries() + _calibrated_entries()
