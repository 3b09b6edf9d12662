"""Checkpoint a sharded training run with ``torch.distributed.checkpoint``, kill a rank, and resume it exactly.

A run can resume as if nothing happened only if the checkpoint holds
everything the next step reads (Llama 3's team, section 3.3.4 of its paper,
and every framework since, save the same list):

- the **model** and **optimizer** states (here FSDP2-sharded ``DTensor``\\ s: each
  rank writes its own shards, and ``torch.distributed.checkpoint`` (DCP)
  records their global layout, so a run saved on 4 ranks loads on 2);
- the **learning-rate schedule** (a ``LambdaLR``'s step count);
- the **data loader's position**: here the step, since batch ``k`` is drawn
  from a generator seeded by ``k`` (:func:`batch_for_step`);
- every rank's **random-number state** (dropout, sampling): a per-rank file
  beside the DCP folder, since ranks' streams differ.

:func:`train` runs ``steps`` steps of part 3's tiny LLaMA with FSDP2 on gloo
ranks (:func:`utils.dist.launch`), saving every ``every`` steps into
``folder/step-K`` (DCP, synchronous or ``async_save``), and can kill one rank
with a real ``SIGKILL`` at a given step; the launcher then raises
:class:`utils.dist.WorkerError` naming the dead rank. ``resume=True`` starts
from the latest complete checkpoint, on any number of ranks that divides the
batch. On the same number of ranks the result is bitwise the uninterrupted
run's; on another, the gradient reductions add in another order, so it agrees
to rounding.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.validate import check_positive_int

CONFIG = LlamaConfig(vocab=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2)
"""The model: part 3's tiny LLaMA, small enough that a run of a dozen steps on four CPU ranks takes seconds."""
BATCH, SEQ_LEN = 8, 16
"""Sequences per step (split over the ranks) and tokens per sequence."""
COMPLETE = "COMPLETE"
"""The marker file rank 0 writes last into a checkpoint folder: a folder without it is ignored when resuming."""


def batch_for_step(step: int) -> torch.Tensor:
    """The tokens of step ``step``, ``(BATCH, SEQ_LEN + 1)``: a generator seeded by the step, so that the data
    loader's whole state is the step number."""
    generator = torch.Generator().manual_seed(10_000 + step)
    return torch.randint(0, CONFIG.vocab, (BATCH, SEQ_LEN + 1), generator=generator)


def build(world_size: int, lr: float = 1e-2) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """The tiny LLaMA, FSDP2-sharded over ``world_size`` CPU ranks (each block, then the root), its AdamW and a
    4-step linear warm-up (``LambdaLR``); call inside a process group. Seeded: every rank builds the same model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = TinyLlama(CONFIG)
    mesh = init_device_mesh("cpu", (world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / 4))  # 4 warm-up steps
    return model, optimizer, schedule


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, schedule: Any, step: int, rank: int,
               world_size: int) -> float:
    """One step on this rank's share of :func:`batch_for_step` (every ``world_size``-th sequence); the mean loss
    over all ranks."""
    tokens = batch_for_step(step)[rank::world_size]
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, CONFIG.vocab), tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    schedule.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / world_size


def _save(folder: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, schedule: Any, rank: int,
          use_async: bool) -> float:
    """Write checkpoint ``folder/step-{step}``; return the seconds the training loop was blocked."""
    target = folder / f"step-{step}"
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, "step": torch.tensor(step),
             "schedule": torch.tensor(schedule.last_epoch)}
    start = time.perf_counter()
    if use_async:
        future = dcp.async_save(state, checkpoint_id=str(target))
        blocked = time.perf_counter() - start
        future.result()  # a real loop would wait only before the next save; here it is waited on at once
    else:
        dcp.save(state, checkpoint_id=str(target))
        blocked = time.perf_counter() - start
    torch.save(torch.get_rng_state(), target / f"rng-rank{rank}.pt")
    dist.barrier()
    if rank == 0:
        (target / COMPLETE).write_text(str(step))
    return blocked


def latest_checkpoint(folder: str | Path) -> tuple[int, Path] | None:
    """``(step, path)`` of the newest complete checkpoint under ``folder``, or None."""
    found = []
    for path in Path(folder).glob("step-*"):
        if (path / COMPLETE).exists():
            found.append((int(path.name.split("-", 1)[1]), path))
    return max(found) if found else None


def _load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, schedule: Any, rank: int) -> int:
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, "step": torch.tensor(0), "schedule": torch.tensor(0)}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    schedule.last_epoch = int(state["schedule"])
    rng = path / f"rng-rank{rank}.pt"
    if rng.exists():  # a run resumed on more ranks than it was saved from starts those ranks' streams afresh
        torch.set_rng_state(torch.load(rng))
    return int(state["step"])


def _worker(rank: int, world_size: int, folder: str, steps: int, every: int, resume: bool,
            kill_rank: int | None, kill_at: int | None, use_async: bool) -> dict[str, Any]:
    model, optimizer, schedule = build(world_size)
    start, losses, blocked = 0, {}, []
    if resume:
        latest = latest_checkpoint(folder)
        if latest is None:
            raise FileNotFoundError(f"no complete checkpoint under {folder} to resume from")
        start = _load(latest[1], model, optimizer, schedule, rank) + 1
    for step in range(start, steps):
        if kill_at is not None and step == kill_at and rank == kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)  # the node dies: no exception, no cleanup
        losses[step] = train_step(model, optimizer, schedule, step, rank, world_size)
        if every and (step + 1) % every == 0:
            blocked.append(_save(Path(folder), step, model, optimizer, schedule, rank, use_async))
    params = {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}
    return {"losses": losses, "params": params, "blocked": blocked, "start": start}


class RunResult(NamedTuple):
    """What a run returns: the loss of each step it ran, the final parameters, the seconds each save blocked."""

    losses: dict[int, float]
    params: dict[str, torch.Tensor]
    blocked_seconds: list[float]
    first_step: int


def train(folder: str | Path, world_size: int = 4, steps: int = 12, every: int = 4, resume: bool = False,
          kill_rank: int | None = None, kill_at: int | None = None, use_async: bool = False,
          timeout: float = 120.0) -> RunResult:
    """Train ``steps`` steps (from the latest checkpoint if ``resume``) on ``world_size`` gloo ranks with FSDP2.

    Saves every ``every`` steps (0: never) into ``folder``. ``kill_rank`` is
    killed with ``SIGKILL`` when it reaches step ``kill_at``, and the launcher
    raises :class:`utils.dist.WorkerError`. ``world_size`` must divide the
    batch of :data:`BATCH` sequences.
    """
    check_positive_int("world_size", world_size)
    check_positive_int("steps", steps)
    if BATCH % world_size:
        raise ValueError(f"world_size must divide the batch of {BATCH} sequences, got {world_size}")
    if not isinstance(every, int) or every < 0:
        raise ValueError(f"every must be an int >= 0 (0: never save), got {every!r}")
    if (kill_rank is None) != (kill_at is None):
        raise ValueError("give both kill_rank and kill_at, or neither")
    if kill_rank is not None and not 0 <= kill_rank < world_size:
        raise ValueError(f"kill_rank must be a rank in [0, {world_size}), got {kill_rank}")
    Path(folder).mkdir(parents=True, exist_ok=True)
    from utils.dist import launch
    results = launch(_worker, world_size, str(folder), steps, every, resume, kill_rank, kill_at, use_async,
                     backend="gloo", timeout=timeout)
    first = results[0]
    return RunResult(first["losses"], first["params"], first["blocked"], first["start"])


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two runs' parameters (``ValueError`` if their names differ)."""
    if a.keys() != b.keys():
        raise ValueError(f"the runs have different parameters: {sorted(a.keys() ^ b.keys())}")
    return max(float((a[k] - b[k]).abs().max()) for k in a)
