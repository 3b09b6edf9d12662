"""Benchmark of pipeline schedules: measured bubble of GPipe and 1F1B against the closed form (p-1)/(m+p-1).

Each rank is one stage of an MLP of ``--n-layers`` square layers (width
``--width``); :func:`utils.parallel.model.pipeline_exec.run_schedule` runs the
schedule's per-stage order with send/recv of activations and gradients. Each
schedule is first checked against one process (same gradients), then timed
``--repeats`` times; rank 0 prints the median measured bubble
``1 - sum(busy) / (p * makespan)`` (idle includes waiting for messages), the
closed form, and the peak stored activations per rank (MiB saved by autograd)
against the schedule's in-flight micro-batches.

    torchrun --nproc-per-node=4 -m benchmarks.pipeline_schedules      # NCCL, one GPU per rank
    python -m benchmarks.pipeline_schedules --world-size 2 --quick     # gloo on the CPU, via utils.dist.launch

On a shared CPU the ranks compete for cores, so a stage's compute is slower
while its neighbours compute too: the measured bubble is a noisy estimate there.
``--emulate-ms T`` adds T ms of ``time.sleep`` to each forward and 2T to each
backward (sleeping ranks leave the cores to the others), which shows the
schedule's own bubble on any CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from utils.dist import NCCL_BACKEND, default_backend, launch, torchrun_main
from utils.dist_policy import worker_device
from utils.parallel.model import pipeline as pp
from utils.parallel.model.pipeline_exec import measured_bubble_fraction, run_schedule, split_layers

KINDS = ("gpipe", "1f1b")


def make_layers(n_layers: int, width: int, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(n_layers)]


def worker(rank: int, world_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """For each schedule: one checked step (gradients returned), then ``repeats`` timed steps."""
    dev = worker_device()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(args.batch, args.width, generator=g), torch.randn(args.batch, args.width, generator=g)
    out: dict[str, Any] = {"device": str(dev)}
    for kind in KINDS:
        pieces = [p.to(dev) for p in split_layers(make_layers(args.n_layers, args.width), world_size)]
        sleep = (args.emulate_ms / 1e3, 2 * args.emulate_ms / 1e3) if args.emulate_ms else None
        first = run_schedule(kind, pieces, x, y, args.microbatches)  # also the warm-up: gloo connects lazily
        runs = []
        for _ in range(args.repeats):
            for piece in pieces:
                piece.zero_grad(set_to_none=True)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            runs.append(run_schedule(kind, pieces, x, y, args.microbatches, sleep_seconds=sleep))
        grads: list[Any] = [None] * world_size
        dist.all_gather_object(grads, {k: v.cpu() for k, v in first.grads.items()})  # every stage's, for the check
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, [(r.busy_seconds, r.end_seconds) for r in runs])
        bubbles = [1 - sum(g[i][0] for g in gathered) / (world_size * max(g[i][1] for g in gathered))
                   for i in range(args.repeats)]
        out[kind] = {"grads": {k: v for g in grads for k, v in g.items()}, "bubbles": bubbles,
                     "peak_in_flight": first.peak_in_flight, "peak_saved_nbytes": first.peak_saved_nbytes,
                     "step_seconds": statistics.median(max(g[i][1] for g in gathered) for i in range(args.repeats))}
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    gpu = "RANK" in os.environ and default_backend(local_world_size) == NCCL_BACKEND
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2, help="ranks to start without torchrun (gloo)")
    parser.add_argument("--n-layers", type=int, default=16)
    parser.add_argument("--width", type=int, default=4096 if gpu else 256)
    parser.add_argument("--batch", type=int, default=1024 if gpu else 256, help="global batch (rows)")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--emulate-ms", type=float, default=0.0,
                        help="emulated compute per forward (ms; backward 2x) added with time.sleep")
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 repeats (a smoke test)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before launch gives up (gloo)")
    args = parser.parse_args(argv)
    if args.quick:
        args.n_layers, args.width, args.batch, args.microbatches, args.repeats = 4, 32, 32, 4, 2
    return args


def report(args: argparse.Namespace, world_size: int, results: dict[str, Any]) -> dict[str, float]:
    """Check gradients against one process, print measured vs predicted; return the median bubbles."""
    layers = make_layers(args.n_layers, args.width)
    model = nn.Sequential(*layers)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(args.batch, args.width, generator=g), torch.randn(args.batch, args.width, generator=g)
    nn.functional.mse_loss(model(x), y).backward()
    pieces = split_layers(layers, world_size)
    print(f"{world_size} stages, {args.n_layers} layers of width {args.width}, batch {args.batch} "
          f"in m = {args.microbatches} micro-batches, {args.repeats} timed steps"
          + (f", plus emulated compute {args.emulate_ms:g} ms F / {2 * args.emulate_ms:g} ms B" if args.emulate_ms else ""))
    if results["device"].startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name(0)}, NCCL (torch {torch.__version__})")
    else:
        print(f"device: CPU, gloo (torch {torch.__version__}): ranks share cores; timings are noisy")
    medians = {}
    for kind in KINDS:
        r = results[kind]
        got = [r["grads"][f"{k}.{n}"] for k in range(world_size) for n, _ in pieces[k].named_parameters()]
        torch.testing.assert_close(got, [p.grad for p in model.parameters()], rtol=1e-4, atol=1e-5)
        predicted = pp.ideal_bubble_fraction(kind, world_size, args.microbatches)
        medians[kind] = statistics.median(r["bubbles"])
        print(f"{kind:>6}: same gradients as one process | bubble measured {medians[kind]:6.1%} "
              f"(min {min(r['bubbles']):.1%}, max {max(r['bubbles']):.1%}) vs (p-1)/(m+p-1) = {predicted:.1%} "
              f"| step {1e3 * r['step_seconds']:.1f} ms | rank 0 stores {r['peak_in_flight']} micro-batches, "
              f"{r['peak_saved_nbytes'] / 2**20:.2f} MiB")
    return medians


def main(argv: Sequence[str] | None = None) -> dict[str, float] | None:
    args = parse_args(argv)
    if "RANK" in os.environ:  # started by torchrun
        world_size = int(os.environ["WORLD_SIZE"])
        results = torchrun_main(worker, args)
        return report(args, world_size, results) if int(os.environ["RANK"]) == 0 else None
    results = launch(worker, args.world_size, args, backend="gloo", timeout=args.timeout)
    return report(args, args.world_size, results[0])


if __name__ == "__main__":
    main()
