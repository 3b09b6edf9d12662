"""Part 6's recordings from a GPU: a CUDA trace of a training step, a memory snapshot, and Inductor's Triton.

Run from the repository root on a machine with a CUDA GPU, torch and triton (no Jupyter)::

    python -m benchmarks.production_recordings --out DIR
    python -m benchmarks.production_recordings --out DIR --allow-cpu     # a smoke test: the CPU trace only

What each chapter of part 6 can only show from a GPU, written to ``DIR``:

- ``step-trace.json.gz``: ``torch.profiler`` (CPU and CUDA activities) over the profiling chapter's step
  (:func:`utils.production.profiled_step.training_step`, part 3's tiny LLaMA, batch 8 of 64 tokens), one
  wait, one warm-up and two active steps: the kernels on the GPU's streams under the operators that
  launched them, for the chapter's timeline widget (:func:`utils.production.trace_timeline.read_chrome_trace`
  reads the file after ``gunzip``);
- ``memory-snapshot.pickle``: ``torch.cuda.memory._record_memory_history`` over three steps of the same
  model, dumped with ``_dump_snapshot`` (open it at pytorch.org/memory_viz);
- ``inductor-block.py``: the module Inductor generates for the compilers chapter's LLaMA block
  (``utils.production.compiler.inductor_code``) on the GPU, whose kernels are Triton;
- ``summary.txt``: what the trace holds (events, kernels, streams), the generated module's kernels and
  library calls, and the block timed eager, compiled, and compiled with ``mode="reduce-overhead"``
  (CUDA graphs), the median of 100 calls after warm-up.

Without a GPU the script refuses (exit code 2) unless ``--allow-cpu`` is given; then it writes the CPU
trace and the summary and skips the rest, saying so.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from utils.attention.llama import Block, LlamaConfig
from utils.production import compiler
from utils.production.profiled_step import model_and_data, quiet_kineto, training_step
from utils.production.trace_timeline import read_chrome_trace

BLOCK = LlamaConfig(dim=64, n_heads=4, n_kv_heads=2)
"""The compilers chapter's block."""


def record_trace(out: Path, device: str) -> list[str]:
    """Profile two training steps; write ``step-trace.json.gz``; return the summary's lines."""
    model, optimizer, tokens = model_and_data(8, 64, 0, device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    raw = out / "step-trace.json"
    with quiet_kineto(), profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=2),
                                 on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        for _ in range(4):
            training_step(model, optimizer, tokens)
            prof.step()
    events = read_chrome_trace(raw)
    with open(raw, "rb") as src, gzip.open(out / "step-trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    kernels = [e for e in events if e.category == "kernel"]
    lanes = sorted({e.lane for e in kernels})
    return [f"trace: {len(events):,} events, {len(kernels):,} GPU kernels on {len(lanes)} lane(s) {lanes}"]


def record_memory_snapshot(out: Path) -> list[str]:
    """Three training steps under the CUDA caching allocator's history; ``memory-snapshot.pickle``."""
    model, optimizer, tokens = model_and_data(8, 64, 0, "cuda")
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    for _ in range(3):
        training_step(model, optimizer, tokens)
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(str(out / "memory-snapshot.pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)
    return [f"memory snapshot: peak {torch.cuda.max_memory_allocated() / 1e6:.1f} MB allocated over 3 steps"]


def record_inductor(out: Path) -> list[str]:
    """The block's generated module on the GPU, and the block timed eager, compiled, and with CUDA graphs."""
    torch.manual_seed(0)
    block = Block(BLOCK).cuda().eval()
    x = torch.randn(2, 16, BLOCK.dim, device="cuda")
    with torch.no_grad():
        compiled_out, generated = compiler.inductor_code(block, x)
        torch.testing.assert_close(compiled_out, block(x), rtol=1e-4, atol=1e-4)
    (out / "inductor-block.py").write_text(generated.source)
    calls = generated.calls
    lines = [f"inductor: {len(generated.kernels)} generated kernels {generated.kernels}",
             f"inductor: one run makes {len(calls)} calls: {calls}"]
    one = torch.randn(1, 1, BLOCK.dim, device="cuda")
    for mode in ("eager", "default", "reduce-overhead"):
        torch._dynamo.reset()
        fn = block if mode == "eager" else torch.compile(block, mode=mode)
        times = []
        with torch.no_grad():
            for i in range(110):
                torch.cuda.synchronize()
                start = time.perf_counter()
                fn(one)
                torch.cuda.synchronize()
                if i >= 10:
                    times.append(time.perf_counter() - start)
            torch.testing.assert_close(fn(one).clone(), block(one), rtol=1e-4, atol=1e-4)
        lines.append(f"block at batch 1, one token, {mode}: {statistics.median(times) * 1e6:.1f} us a call "
                     "(median of 100, synchronised)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.production_recordings",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for the recordings")
    parser.add_argument("--allow-cpu", action="store_true", help="without a GPU: the CPU trace only")
    args = parser.parse_args(argv)
    on_gpu = torch.cuda.is_available()
    if not on_gpu and not args.allow_cpu:
        print("benchmarks.production_recordings needs a CUDA GPU (or --allow-cpu for a smoke test)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cuda" if on_gpu else "cpu"
    header = (f"{torch.cuda.get_device_name() if on_gpu else 'CPU'}, torch {torch.__version__}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    lines = [header] + record_trace(out, device)
    if on_gpu:
        lines += record_memory_snapshot(out) + record_inductor(out)
    else:
        lines.append("memory snapshot and Inductor's Triton: skipped, they need a CUDA GPU")
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
