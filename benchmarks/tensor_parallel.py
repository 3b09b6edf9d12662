"""Benchmark of the chapter and lab on tensor parallelism: a stack of Megatron MLPs on t ranks against one device.

Every rank builds the same stack of ``--layers`` transformer MLPs (hidden ``h``,
``4h`` inside), then its tensor-parallel version
(:class:`utils.parallel.model.tensor_parallel.TensorParallelMLP`: ``fc1``
column-parallel, ``fc2`` row-parallel). Before timing, one forward and backward
in fp32 is checked against the full stack on the same rank (output, input
gradient, every weight gradient slice; ``torch.testing.assert_close``), and the
all-reduces of one step are counted with PyTorch's ``CommDebugMode``
(Megatron-LM, arXiv:1909.08053: one per MLP forward, one backward). Then it
times a forward plus backward step of the full stack on one device and of the
tensor-parallel stack on t, and rank 0 prints the medians (slowest rank).

    torchrun --nproc-per-node=8 -m benchmarks.tensor_parallel           # NCCL, one GPU per rank, bf16
    python -m benchmarks.tensor_parallel --world-size 2 --quick          # gloo on the CPU, via utils.dist.launch

On a CPU the ranks share the machine's cores and talk through gloo: the
timings say nothing about GPUs. On GPUs in one NVLink node they show what the
chapter predicts: each rank does ``1/t`` of the FLOPs and adds ``2`` all-reduces
of ``b s h`` elements per layer per step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.debug import CommDebugMode

from utils.dist import NCCL_BACKEND, default_backend, launch, torchrun_main
from utils.dist_policy import worker_device
from utils.parallel.memory import tensor_parallel_allreduce_bytes_per_layer
from utils.parallel.model.tensor_parallel import MLP, TensorParallelMLP

TOLERANCE = dict(rtol=1e-4, atol=1e-5)  # fp32, sums in another order


def _stack(hidden: int, layers: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(MLP(hidden) for _ in range(layers)))


def _step(model: nn.Module, x: torch.Tensor) -> None:
    model(x).float().pow(2).mean().backward()


def _median_seconds(model: nn.Module, x: torch.Tensor, steps: int) -> float:
    """Median of ``steps`` timed forward+backward steps after one warm-up, the slowest rank's."""
    times = []
    for step in range(steps + 1):
        dist.barrier()
        if x.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        _step(model, x)
        if x.is_cuda:
            torch.cuda.synchronize()
        if step:
            times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    median = torch.tensor(statistics.median(times), device=x.device)
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    return median.item()


def check(rank: int, world_size: int, batch: int, seq: int, hidden: int, layers: int) -> int:
    """Assert the tensor-parallel stack equals the full one (fp32); return the all-reduces of one step."""
    dev = worker_device()
    full = _stack(hidden, layers).to(dev)
    parallel = nn.Sequential(*(TensorParallelMLP(m) for m in full)).to(dev)
    torch.manual_seed(1)
    x = torch.randn(batch, seq, hidden, device=dev)
    x_full, x_tp = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    _step(full, x_full)
    with CommDebugMode() as comm:
        _step(parallel, x_tp)
    torch.testing.assert_close(x_tp.grad, x_full.grad, **TOLERANCE)
    torch.testing.assert_close(parallel(x), full(x), **TOLERANCE)
    for a, b in zip(full, parallel):
        torch.testing.assert_close(b.fc1.weight.grad, a.fc1.weight.grad.chunk(world_size, 0)[rank], **TOLERANCE)
        torch.testing.assert_close(b.fc2.weight.grad, a.fc2.weight.grad.chunk(world_size, 1)[rank], **TOLERANCE)
        torch.testing.assert_close(b.fc2.bias.grad, a.fc2.bias.grad, **TOLERANCE)
    return sum(n for op, n in comm.get_comm_counts().items() if "all_reduce" in str(op) or "allreduce" in str(op))


def worker(rank: int, world_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Check, then time the full stack and the tensor-parallel one on this rank."""
    dev = worker_device()
    n_all_reduce = check(rank, world_size, 2, 8, 16 * world_size, 2)
    dtype = getattr(torch, args.dtype)
    full = _stack(args.hidden, args.layers).to(dev, dtype)
    parallel = nn.Sequential(*(TensorParallelMLP(m) for m in full))
    x = torch.randn(args.batch, args.seq, args.hidden, device=dev, dtype=dtype)
    one = _median_seconds(full, x, args.steps)
    del full
    tp = _median_seconds(parallel, x, args.steps)
    return {"one_device_seconds": one, "tp_seconds": tp, "n_all_reduce_per_step_check": n_all_reduce,
            "device": str(dev), "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    gpu = "RANK" in os.environ and default_backend(local_world_size) == NCCL_BACKEND
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2, help="ranks to start without torchrun (gloo)")
    parser.add_argument("--batch", type=int, default=4 if gpu else 2, help="micro-batch b")
    parser.add_argument("--seq", type=int, default=2048 if gpu else 64, help="sequence length s")
    parser.add_argument("--hidden", type=int, default=8192 if gpu else 256, help="hidden size h (the MLP is 4h wide)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dtype", default="bfloat16" if gpu else "float32", choices=["float32", "bfloat16"])
    parser.add_argument("--quick", action="store_true", help="small sizes and few steps: a smoke test")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before launch gives up (gloo)")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.seq, args.hidden, args.layers, args.steps = 2, 32, 64, 2, 3
    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    return args


def report(args: argparse.Namespace, world_size: int, result: dict[str, Any]) -> None:
    """Print the configuration, the checks and the step times (rank 0)."""
    element = 2 if args.dtype == "bfloat16" else 4
    nbytes = tensor_parallel_allreduce_bytes_per_layer(args.seq, args.batch, args.hidden, element)
    print(f"tensor parallel MLP stack: t = {world_size}, {args.layers} layers, h = {args.hidden} (4h inside), "
          f"b = {args.batch}, s = {args.seq}, {args.dtype}")
    if result["device"].startswith("cuda"):
        print(f"device: {result['device_name']}, NCCL (torch {torch.__version__}, CUDA {torch.version.cuda})")
    else:
        print(f"device: CPU, gloo (torch {torch.__version__}): these timings say nothing about GPU speed")
    print(f"check: output and all gradients equal the full stack (fp32); all-reduces per step of a 2-layer "
          f"stack: {result['n_all_reduce_per_step_check']} (Megatron: 2 per layer)")
    print(f"all-reduce of b s h = {nbytes / 2**20:.2f} MiB, {2 * args.layers} per step")
    one, tp = result["one_device_seconds"], result["tp_seconds"]
    print(f"one device: {1e3 * one:9.2f} ms per step")
    print(f"t = {world_size}:      {1e3 * tp:9.2f} ms per step (speed-up {one / tp:.2f}x, ideal {world_size}x)")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if "RANK" in os.environ:  # started by torchrun
        world_size = int(os.environ["WORLD_SIZE"])
        result = torchrun_main(worker, args)
        if int(os.environ["RANK"]) == 0:
            report(args, world_size, result)
        return
    results = launch(worker, args.world_size, args, backend="gloo", timeout=args.timeout)
    report(args, args.world_size, results[0])


if __name__ == "__main__":
    main()
