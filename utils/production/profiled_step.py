"""A tiny LLaMA training step under ``torch.profiler``: on one process, and as DDP on several gloo ranks.

The step is part 3's :class:`~utils.attention.llama.TinyLlama` on random
tokens, with next-token cross-entropy and AdamW, its three phases marked with
``record_function`` ranges (``forward``, ``backward``, ``optimizer``) so that
the trace shows where each begins. :func:`profile_step` profiles it on this
process with a ``schedule`` (``wait`` steps skipped, ``warmup`` steps traced
and thrown away, ``active`` steps kept) and writes the Chrome trace;
:func:`profile_ddp` runs it as ``DistributedDataParallel`` on ``world_size``
gloo ranks (:func:`utils.dist.launch`), each rank writing its own trace, one
rank optionally made a *straggler* by sleeping inside its forward: the others
then wait in the gradient all-reduce, and the traces show where.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.validate import check_nonnegative, check_nonnegative_int, check_positive_int

CONFIG = LlamaConfig(vocab=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2)
"""The profiled model: part 3's tiny LLaMA, two layers of width 64, grouped-query attention."""


@contextlib.contextmanager
def quiet_kineto() -> Iterator[None]:
    """Drop the ``USDT: ... profiler_start`` / ``profiler_stop`` lines Kineto writes to stderr; keep every other line.

    The C++ side writes to file descriptor 2, so this points it at a temporary
    file for the duration and writes back what is not Kineto's start/stop log.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().decode(errors="replace").splitlines(keepends=True)
                    if not (line.startswith("USDT:") and "ActivityProfiler" in line)]
            if kept:
                sys.stderr.write("".join(kept))


def time_step(batch: int = 8, seq_len: int = 64, steps: int = 5, warmup: int = 2, seed: int = 0) -> float:
    """Seconds of the fastest of ``steps`` training steps at ``batch`` sequences, without the profiler.

    ``warmup`` untimed steps come first. The fastest, not the median: other
    processes on the machine can only add time to a step, so the minimum is the
    estimate that load moves least (the advice of Python's ``timeit``).
    """
    check_positive_int("batch", batch)
    check_positive_int("steps", steps)
    check_nonnegative_int("warmup", warmup)
    model, optimizer, tokens = model_and_data(batch, seq_len, seed)
    for _ in range(warmup):
        training_step(model, optimizer, tokens)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        training_step(model, optimizer, tokens)
        times.append(time.perf_counter() - start)
    return min(times)


def training_step(model: nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor,
                  straggle_seconds: float = 0.0) -> float:
    """One step: next-token cross-entropy of ``tokens`` ``(batch, seq)``, backward, AdamW; returns the loss.

    ``straggle_seconds`` sleeps inside the forward range (a slow data loader or a
    slow GPU, as the other ranks of a DDP job see it).
    """
    with record_function("forward"):
        if straggle_seconds:
            time.sleep(straggle_seconds)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    with record_function("backward"):
        loss.backward()
    with record_function("optimizer"):
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.detach().item()


def model_and_data(batch: int, seq_len: int, seed: int,
                   device: str = "cpu") -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    """The profiled model (seeded), its AdamW (lr 1e-3) and ``batch`` random sequences of ``seq_len + 1`` tokens.

    Drawn on the CPU, then moved to ``device``: the same weights and tokens on any device.
    """
    torch.manual_seed(seed)
    model = TinyLlama(CONFIG).to(device)
    tokens = torch.randint(0, CONFIG.vocab, (batch, seq_len + 1)).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), tokens


def _check_schedule(wait: int, warmup: int, active: int) -> None:
    check_nonnegative_int("wait", wait)
    check_nonnegative_int("warmup", warmup)
    check_positive_int("active", active)


def profile_step(trace_path: str | Path, batch: int = 8, seq_len: int = 64, wait: int = 1, warmup: int = 1,
                 active: int = 2, record_shapes: bool = True, profile_memory: bool = False,
                 seed: int = 0) -> profile:
    """Profile ``wait + warmup + active`` training steps on this process; write the active steps' Chrome trace.

    Returns the profiler, whose ``key_averages()`` tables the same active steps.
    """
    check_positive_int("batch", batch)
    check_positive_int("seq_len", seq_len)
    _check_schedule(wait, warmup, active)
    model, optimizer, tokens = model_and_data(batch, seq_len, seed)
    path = str(trace_path)
    with quiet_kineto(), profile(activities=[ProfilerActivity.CPU],
                                 schedule=schedule(wait=wait, warmup=warmup, active=active),
                                 on_trace_ready=lambda p: p.export_chrome_trace(path), record_shapes=record_shapes,
                                 profile_memory=profile_memory) as prof:
        for _ in range(wait + warmup + active):
            training_step(model, optimizer, tokens)
            prof.step()
    return prof


def _ddp_worker(rank: int, world_size: int, trace_dir: str, steps: int, straggler: int | None,
                straggle_seconds: float, batch: int, seq_len: int) -> dict[str, Any]:
    model, _, tokens = model_and_data(batch, seq_len, seed=rank)
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(TinyLlama(CONFIG))
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    delay = straggle_seconds if rank == straggler else 0.0
    training_step(ddp, optimizer, tokens)  # untraced: DDP builds its buckets on the first backward
    dist.barrier()
    with quiet_kineto(), profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            with record_function("train_step"):
                training_step(ddp, optimizer, tokens, delay)
    path = Path(trace_dir) / f"rank{rank}.json"
    prof.export_chrome_trace(str(path))
    return {"rank": rank, "trace": str(path)}


def profile_ddp(trace_dir: str | Path, world_size: int = 2, steps: int = 2, straggler: int | None = None,
                straggle_seconds: float = 0.0, batch: int = 4, seq_len: int = 64) -> list[str]:
    """Profile ``steps`` DDP training steps on ``world_size`` gloo ranks; return each rank's trace path, in rank order.

    Every rank trains the same model (same seed) on its own tokens; rank
    ``straggler`` (if any) sleeps ``straggle_seconds`` in each forward. One
    untraced step first lets DDP build its gradient buckets.
    """
    check_positive_int("world_size", world_size)
    check_positive_int("steps", steps)
    check_nonnegative("straggle_seconds", straggle_seconds, finite=True)
    if straggler is not None and not (isinstance(straggler, int) and 0 <= straggler < world_size):
        raise ValueError(f"straggler must be None or a rank in [0, {world_size}), got {straggler!r}")
    folder = Path(trace_dir)
    folder.mkdir(parents=True, exist_ok=True)
    from utils.dist import launch
    results = launch(_ddp_worker, world_size, str(folder), steps, straggler, straggle_seconds, batch, seq_len,
                     backend="gloo", timeout=120.0)
    return [r["trace"] for r in sorted(results, key=lambda r: r["rank"])]
