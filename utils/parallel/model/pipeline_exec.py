"""Run a pipeline schedule for real: one rank per stage, activations and gradients by send/recv.

:func:`run_schedule` executes the per-stage operation order of
:func:`utils.parallel.model.pipeline.stage_orders` on the calling rank (stage =
rank): for each F it receives the input activation from the previous virtual
stage (``dist.recv``), runs its layers and sends the output on (``dist.isend``);
for each B it receives the output's gradient from the next virtual stage, runs
backward and sends the input's gradient back. The last virtual stage computes
the loss, ``loss_fn(output, target) / m`` per micro-batch, so the accumulated
gradients equal those of one process on the whole batch with the mean loss.

Sends are non-blocking and only waited for at the end, as Megatron batches a
send with the next receive (``send_forward_recv_backward``): two neighbours that
both send first (one its activation, the other a gradient) would otherwise
wait for each other. Receives name their source and a tag that encodes (kind,
chunk, micro-batch); gloo matches by tag, NCCL ignores tags and matches by
order, which is the same order for GPipe and 1F1B.

It records, per operation, when its compute started and ended (after its
receive arrived), the bytes autograd saved for backward during each forward
(``torch.autograd.graph.saved_tensors_hooks``) and the peak of those bytes
held at once, the stored activations of the schedule's in-flight micro-batches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from utils.dist_policy import worker_device
from utils.parallel.model.pipeline import stage_orders


@dataclass
class StageRun:
    """What one rank did in :func:`run_schedule`; times in seconds from the common start (a barrier)."""

    grads: dict[str, torch.Tensor]
    """Gradients of this rank's parameters, named ``"<virtual stage>.<parameter name>"``."""
    loss: float
    """Sum of the micro-batch losses (the mean loss over the batch); 0.0 on ranks without the last stage."""
    ops: list[tuple[str, int, int, float, float]] = field(default_factory=list)
    """(kind, chunk, microbatch, compute start, compute end) in the order run."""
    busy_seconds: float = 0.0
    end_seconds: float = 0.0
    peak_saved_nbytes: int = 0
    saved_nbytes_per_microbatch: float = 0.0
    peak_in_flight: int = 0


def stage_layers(n_layers: int, n_parts: int) -> list[range]:
    """The indices of the layers of each of ``n_parts`` contiguous, nearly equal pieces of ``n_layers`` layers."""
    if not 1 <= n_parts <= n_layers:
        raise ValueError(f"n_parts must be between 1 and the number of layers ({n_layers}), got {n_parts}")
    bounds = [round(i * n_layers / n_parts) for i in range(n_parts + 1)]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def split_layers(layers: Sequence[nn.Module], n_parts: int) -> list[nn.Sequential]:
    """Cut a list of layers into ``n_parts`` contiguous, nearly equal ``nn.Sequential`` pieces."""
    return [nn.Sequential(*(layers[i] for i in part)) for part in stage_layers(len(layers), n_parts)]


def _tag(kind: str, chunk: int, microbatch: int, n_microbatches: int) -> int:
    return (2 * chunk + (kind == "B")) * n_microbatches + microbatch


def run_schedule(
    kind: str,
    pieces: Sequence[nn.Module],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    n_microbatches: int,
    n_chunks: int = 1,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.mse_loss,
    activation_shape: Sequence[int] | None = None,
    sleep_seconds: tuple[float, float] | None = None,
    group: dist.ProcessGroup | None = None,
    activation_dtype: torch.dtype | None = None,
) -> StageRun:
    """Run one training step's forwards and backwards of schedule ``kind`` on this rank; return a :class:`StageRun`.

    ``pieces`` are the ``p * n_chunks`` virtual stages of the whole model (every
    rank may build all of them from one seed; rank ``s`` runs pieces ``c * p + s``),
    already on this rank's device. ``inputs`` and ``targets`` are the whole
    batch (only the first and last virtual stage read them); it is cut into
    ``n_microbatches`` equal micro-batches. ``activation_shape`` is one
    micro-batch's activation between pieces (default: the input's shape per
    micro-batch, so every piece must keep the width). ``sleep_seconds = (t_f, t_b)``
    adds that much emulated compute (``time.sleep``) to each F and B of a whole
    stage (``1 / n_chunks`` of it per chunk): a sleeping rank leaves the CPU
    to the others, so on a machine with fewer cores than ranks the schedule's
    timing can still be measured.

    ``group`` (default: the whole world) is the pipeline: its ``k``-th rank runs stage ``k``, so a pipeline can
    be one dimension of a larger mesh. ``activation_dtype`` is the dtype of the activations and gradients
    received between stages (default: torch's default dtype). A parameter whose gradient another hook has
    already taken away (a ZeRO optimizer's) is left out of :attr:`StageRun.grads`.
    """
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    peer = (lambda s: dist.get_global_rank(group, s)) if group is not None else (lambda s: s)  # noqa: E731
    v = n_chunks
    if len(pieces) != p * v:
        raise ValueError(f"pieces must hold world_size * n_chunks = {p * v} virtual stages, got {len(pieces)}")
    if inputs.shape[0] % n_microbatches:
        raise ValueError(f"the batch ({inputs.shape[0]}) must split into n_microbatches={n_microbatches} equal parts")
    order = stage_orders(kind, p, n_microbatches, v)[rank]
    dev = worker_device()
    xs, ys = inputs.chunk(n_microbatches), targets.chunk(n_microbatches)
    shape = tuple(activation_shape) if activation_shape is not None else tuple(xs[0].shape)
    last = p * v - 1
    stored: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, int]] = {}  # (chunk, mb) -> (in, out, nbytes)
    pending: list[tuple[dist.Work, torch.Tensor]] = []  # keep each sent tensor alive until sent
    run = StageRun(grads={}, loss=0.0)
    held = saved_total = 0
    # On a GPU, wait for the received tensor and the kernels before each time stamp: otherwise the host
    # would time kernel launches, not compute, and count a message's wait as busy time.
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for op_kind, c, i in order:
        k = c * p + rank
        if op_kind == "F":
            if k == 0:
                x = xs[i].to(dev)
            else:
                x = torch.empty(shape, device=dev, dtype=activation_dtype)
                dist.recv(x, src=peer((k - 1) % p), group=group, tag=_tag("F", c if rank else c - 1, i, n_microbatches))
            x.requires_grad_(k > 0)
            saved = [0]

            def pack(t: torch.Tensor, saved=saved) -> torch.Tensor:
                saved[0] += t.numel() * t.element_size()
                return t

            sync()
            start = time.perf_counter()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                y = pieces[k](x)
                if k == last:
                    y = loss_fn(y, ys[i].to(dev)) / n_microbatches
            if sleep_seconds:
                time.sleep(sleep_seconds[0] / v)
            sync()
            end = time.perf_counter()
            if k == last:
                run.loss += y.item()
            else:
                out = y.detach()
                pending.append((dist.isend(out, dst=peer((k + 1) % p), group=group, tag=_tag("F", c, i, n_microbatches)), out))
            stored[(c, i)] = (x, y, saved[0])
            held += saved[0]
            saved_total += saved[0]
        else:
            x, y, nbytes = stored.pop((c, i))
            if k == last:
                grad = None
            else:
                grad = torch.empty_like(y)
                dist.recv(grad, src=peer((k + 1) % p), group=group, tag=_tag("B", c if rank < p - 1 else c + 1, i, n_microbatches))
            sync()
            start = time.perf_counter()
            y.backward(grad)
            if sleep_seconds:
                time.sleep(sleep_seconds[1] / v)
            sync()
            end = time.perf_counter()
            if k > 0:
                pending.append((dist.isend(x.grad, dst=peer((k - 1) % p), group=group, tag=_tag("B", c, i, n_microbatches)), x.grad))
            held -= nbytes
        run.ops.append((op_kind, c, i, start - t0, end - t0))
        run.busy_seconds += end - start
        run.peak_saved_nbytes = max(run.peak_saved_nbytes, held)
        run.peak_in_flight = max(run.peak_in_flight, len(stored))
    for work, _ in pending:
        work.wait()
    run.end_seconds = time.perf_counter() - t0
    run.saved_nbytes_per_microbatch = saved_total / (n_microbatches * v)
    for c in range(v):
        for name, param in pieces[c * p + rank].named_parameters():
            if param.grad is not None:
                run.grads[f"{c * p + rank}.{name}"] = param.grad.detach().clone()
    return run


def measured_bubble_fraction(runs: Sequence[StageRun]) -> float:
    """``1 - sum(busy) / (p * makespan)`` with the makespan the latest rank's end (one host: one clock start)."""
    makespan = max(r.end_seconds for r in runs)
    return 1.0 - sum(r.busy_seconds for r in runs) / (len(runs) * makespan)
