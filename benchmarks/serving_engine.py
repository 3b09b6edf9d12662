"""Part 5 benchmark: the serving engine's decode throughput at batch 64 on a 1.1B model, against its roofline bound.

Run from the repository root on a machine with a CUDA GPU, torch and triton (no Jupyter)::

    python -m benchmarks.serving_engine            # 50 timed steps
    python -m benchmarks.serving_engine --quick    # 20 timed steps

The model is TinyLlama-1.1B's shape (Zhang et al. 2024, arXiv:2401.02385; ``config.json`` of
``TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T``: hidden 2048, FFN 5632, 22 layers, 32 query and
4 KV heads, vocabulary 32000, untied embeddings), 1,100,048,384 parameters, with random weights in fp16
on the GPU. :class:`utils.serving.runtime.engine.Engine` takes 64 requests of 512 prompt tokens, prefills them
(chunked, 8192 tokens a step), and once every step is 64 decodes and nothing else, each step is timed
alone (``torch.cuda.synchronize`` on both sides; the engine's own greedy sampling, one copy of the 64
tokens to the host, is inside): the median of the timed steps, after warm-up steps (Triton compiles then).

The bound is :func:`utils.serving.costs.step_time.step_seconds` of the same step (the 64 contexts each step
attends to): the weights read once (``N b``, all but the input embedding) plus every cache read once, each
part at the larger of its FLOP time and its byte time on the chip's datasheet peaks (:meth:`Roof.of`,
:func:`utils.gpu.hardware.spec_for_device`). Target on an H100 SXM (issue 25): decode throughput within 2x
of that bound, ``tokens/s >= 0.5 x bound``. The same engine then decodes a few steps with its per-request
attention loop (``decode_attention="loop"``), reported only. Each row also gives the ATen operations one
step dispatches (counted with a ``TorchDispatchMode``; the Triton kernels of the batched path, two per layer,
come on top): in eager PyTorch each is at least one kernel launch and some microseconds of host time.

Before timing, one decode step of the batched path is checked against the loop on a copy of the cache.
Without a GPU the script refuses (exit code 2) unless ``--allow-cpu`` is given, which runs a tiny model
(fp32, the split-KV kernel under Triton's interpreter) as a smoke test.
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from dataclasses import dataclass

import utils  # noqa: F401  (first: switches Triton to its interpreter when there is no GPU)
import torch

from benchmarks.common import Result, run
from utils import device
from utils.attention.kv_cache import AttentionConfig
from utils.attention.llama import LlamaConfig, TinyLlama
from utils.attention.llama_sizes import llama_param_count
from utils.gpu.hardware import GpuSpec
from utils.production.compiler import count_aten_ops
from utils.serving.runtime.engine import Engine
from utils.serving.runtime.paged_forward import Segment, forward_segments
from utils.serving.costs.step_time import Roof, ServedModel, attention_flops_per_pair, step_cost, step_seconds

TINYLLAMA_1B = LlamaConfig(vocab=32000, dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, ffn_hidden=5632,
                           eps=1e-5, rope_layout="neox")
"""TinyLlama-1.1B's shape (``config.json`` of TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T)."""
TINYLLAMA_1B_PARAMS = 1_100_048_384
"""Its parameters: ``llama_param_count(2048, 22, 32000, 5632, 32, 4)``, the "1.1B" of its name."""
TARGET_FRACTION_OF_BOUND = 0.5


@dataclass(frozen=True)
class Sizes:
    config: LlamaConfig
    batch: int
    prompt_len: int
    block_size: int
    max_num_batched_tokens: int
    warmup: int
    steps: int
    loop_steps: int


FULL = Sizes(TINYLLAMA_1B, 64, 512, 16, 8192, warmup=5, steps=50, loop_steps=5)
QUICK = Sizes(TINYLLAMA_1B, 64, 512, 16, 8192, warmup=3, steps=20, loop_steps=3)
CPU_SMOKE = Sizes(LlamaConfig(vocab=128, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, rope_layout="neox"),
                  batch=4, prompt_len=12, block_size=4, max_num_batched_tokens=64, warmup=1, steps=2, loop_steps=1)


def served_model(model: TinyLlama, name: str, bytes_per_elem: int = 2) -> ServedModel:
    """The :class:`~utils.serving.costs.step_time.ServedModel` of a TinyLlama: what a step reads and computes.

    ``N`` = all parameters but the input embedding (a step reads ``batch`` of its rows); the cache per token
    and the attention FLOPs per pair from :class:`~utils.attention.kv_cache.AttentionConfig` and
    :func:`~utils.serving.costs.step_time.attention_flops_per_pair`, as :func:`utils.serving.costs.step_time.served_model`
    builds them for the published models.
    """
    c = model.config
    total = sum(p.numel() for p in model.parameters())
    if total != llama_param_count(c.dim, c.n_layers, c.vocab, c.hidden, c.n_heads, c.n_kv_heads):
        raise ValueError(f"{name}: {total} parameters, not the LLaMA count of its config")
    attention = AttentionConfig(name, c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, "this benchmark")
    n = total - model.embed.weight.numel()
    flops = attention_flops_per_pair(attention)
    return ServedModel(name, n, n * bytes_per_elem, total * bytes_per_elem,
                       attention.cache_bytes(bytes_per_elem=bytes_per_elem, use_window=False), flops, flops)


def _params(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{int(n):,}"


def _sync(on_gpu: bool) -> None:
    if on_gpu:
        torch.cuda.synchronize()


def _decode_segments(engine: Engine) -> list[Segment]:
    """The decode segments of the running requests whose blocks already hold their next position.

    (The scheduler allocates a new block only when it schedules the step, so requests at a block boundary
    are left out of this check.)
    """
    size = engine.kv.block_size
    return [Segment((r.tokens[-1],), r.num_computed, tuple(r.blocks)) for r in engine.scheduler.running
            if len(r.blocks) * size > r.num_computed]


def _all_decode(engine: Engine, batch: int) -> bool:
    chunks = engine.stats().schedule[-1].chunks
    return len(chunks) == batch and all(phase == "decode" for _, _, phase in chunks)


def _check_batched_against_loop(engine: Engine, on_gpu: bool) -> float:
    """One decode step through both paths, each on its own copy of the cache: the logits' relative error.

    fp16 on a GPU: the two paths round differently (fp32 accumulation in the kernel, fp16 products in the loop)
    through 22 layers of random weights, so the bound is loose (5e-2); a wrong head, block or mask gives O(1).
    """
    segments = _decode_segments(engine)
    if len(segments) < 2:
        raise AssertionError("too few running requests to check the batched decode path")
    out = {}
    for mode in ("batched", "loop"):
        kv = copy.copy(engine.kv)
        kv.k, kv.v = engine.kv.k.clone(), engine.kv.v.clone()
        out[mode] = forward_segments(engine.model, kv, segments, mode).float()
        del kv
    error = float((out["batched"] - out["loop"]).norm() / out["loop"].norm())
    if not error < (5e-2 if on_gpu else 1e-5):
        raise AssertionError(f"batched decode attention differs from the loop: relative error {error:.2e}")
    return error


def _time_steps(engine: Engine, roof: Roof, cost_model: ServedModel, n: int, on_gpu: bool) -> tuple[float, float]:
    """Median seconds of ``n`` engine steps, and the median roofline seconds of the same steps."""
    measured, bound = [], []
    for _ in range(n):
        contexts = [len(r.tokens) for r in engine.scheduler.running]  # the new token attends to all of them
        bound.append(step_seconds(step_cost(cost_model, contexts), roof))
        _sync(on_gpu)
        start = time.perf_counter()
        engine.step()
        _sync(on_gpu)
        measured.append(time.perf_counter() - start)
    return statistics.median(measured), statistics.median(bound)


def _ops_per_step(engine: Engine) -> int:
    return sum(count_aten_ops(engine.step).values())


def bench_engine(sizes: Sizes, gpu: GpuSpec | None, on_gpu: bool) -> list[Result]:
    """Decode-only steps of a full engine at batch ``sizes.batch``: batched attention, then the loop."""
    c, b = sizes.config, sizes.batch
    dtype = torch.float16 if on_gpu else torch.float32
    with torch.device(device.device()):
        model = TinyLlama(c)
    model = model.to(dtype).eval()
    name = "TinyLlama-1.1B shape" if c == TINYLLAMA_1B else "tiny"
    cost_model = served_model(model, name, bytes_per_elem=torch.finfo(dtype).bits // 8)
    n_new = sizes.warmup + sizes.steps + sizes.loop_steps + 2 + sizes.max_num_batched_tokens // sizes.prompt_len + 8
    blocks_each = -(-(sizes.prompt_len + n_new) // sizes.block_size)
    engine = Engine(model, b * blocks_each + b, sizes.block_size, sizes.max_num_batched_tokens, max_num_seqs=b,
                    decode_attention="batched" if on_gpu else "triton")
    g = torch.Generator().manual_seed(0)
    for _ in range(b):
        engine.add_request(torch.randint(0, c.vocab, (sizes.prompt_len,), generator=g).tolist(), n_new)
    engine.step()
    while not _all_decode(engine, b):
        engine.step()
    error = _check_batched_against_loop(engine, on_gpu)
    roof_name = gpu.name if gpu else "H100-SXM"
    roof = Roof.of(roof_name, "fp16")
    rows = []
    for mode, steps in (("batched", sizes.steps), ("loop", sizes.loop_steps)):
        engine.decode_attention = mode if on_gpu or mode == "loop" else "triton"
        for _ in range(sizes.warmup if mode == "batched" else 1):
            engine.step()
        ops = _ops_per_step(engine)
        seconds, bound_seconds = _time_steps(engine, roof, cost_model, steps, on_gpu)
        if not all(len(r.chunks) == b and {p for _, _, p in r.chunks} == {"decode"}
                   for r in engine.stats().schedule[-steps:]):
            raise AssertionError("a timed step was not decode-only at the full batch")
        value, bound = b / seconds, b / bound_seconds
        fraction = value / bound if gpu else None
        verdict, target = "n/a", "reported only"
        if mode == "batched":
            target = f">= {TARGET_FRACTION_OF_BOUND:.0%} of the roofline bound (within 2x)"
            if on_gpu and fraction is not None:
                verdict = "PASS" if fraction >= TARGET_FRACTION_OF_BOUND else "MISS"
        context = sizes.prompt_len + round(statistics.median(len(r.output) for r in engine.scheduler.running))
        shape = (f"{name} ({_params(cost_model.resident_bytes // dtype.itemsize)} params), batch {b}, "
                 f"context ~{context}, block {sizes.block_size}, {str(dtype).split('.')[-1]}, "
                 f"{ops} ATen ops/step, {seconds * 1e3:.3g} ms/step vs bound {bound_seconds * 1e3:.3g} ms"
                 + (f", logits vs loop rel. err {error:.1e}" if mode == "batched" else ""))
        kernel = "serving engine decode" + ("" if mode == "batched" else " (per-request attention loop)")
        rows.append(Result(kernel, shape, "tokens/s", value, f"roofline bound ({roof_name}, step_time)", bound,
                           fraction, target, verdict))
    return rows


def cases(on_gpu: bool, quick: bool, gpu: GpuSpec | None) -> list[Result]:
    """The engine at batch 64 on the 1.1B model (on a CPU: the tiny smoke sizes)."""
    return bench_engine((QUICK if quick else FULL) if on_gpu else CPU_SMOKE, gpu, on_gpu)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit code (0 done, 1 a target missed with --strict, 2 no GPU)."""
    return run("benchmarks.serving_engine", __doc__.split("\n")[0], cases, argv)


if __name__ == "__main__":
    sys.exit(main())
