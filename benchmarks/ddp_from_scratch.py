"""Benchmark of the lab "DDP from scratch": per-parameter all-reduce, buckets, PyTorch DDP.

Each version of data parallelism in :mod:`utils.parallel.data.data_parallel` trains
the same MLP on N ranks (through :func:`utils.parallel.data.harness.train_data_parallel`);
each is checked against one process trained on the full batch
(``torch.testing.assert_close``), then rank 0 prints its all-reduce calls per
step and its median step time (of the slowest rank, first step excluded).

    torchrun --nproc-per-node=4 -m benchmarks.ddp_from_scratch     # NCCL, one GPU per rank
    python -m benchmarks.ddp_from_scratch --world-size 2            # gloo on the CPU, via utils.dist.launch

Under torchrun on GPUs the default model is larger (16 layers of width 1024)
and the bucket cap is PyTorch's default, 25 MiB; without torchrun the ranks run
gloo on the CPU even on a GPU machine. ``--help`` lists the knobs.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any, Sequence

import torch
import torch.distributed as dist

from utils.dist import NCCL_BACKEND, default_backend, launch, torchrun_main
from utils.dist_policy import worker_device
from utils.parallel.data import harness

TOLERANCE = dict(rtol=1e-4, atol=1e-5)  # fp32 sums in another order; Adam amplifies them a little


def worker(rank: int, world_size: int, strategies: Sequence[str], config: harness.TrainConfig,
           bucket_cap_bytes: int) -> dict[str, Any]:
    """Train with each strategy; add ``median_step_seconds``, the slowest rank's median step time."""
    out = {}
    for strategy in strategies:
        result = harness.train_data_parallel(rank, world_size, strategy, config, bucket_cap_bytes)
        median = torch.tensor(statistics.median(result["step_seconds"][1:]), device=worker_device())
        dist.all_reduce(median, op=dist.ReduceOp.MAX)
        result["median_step_seconds"] = median.item()
        result["weights"] = {k: v.cpu() for k, v in result["weights"].items()}
        result["device"] = str(worker_device())
        out[strategy] = result
    return out


def parse_args(argv: Sequence[str] | None, description: str) -> argparse.Namespace:
    # GPU-sized defaults only where the ranks will run on GPUs: under torchrun, with NCCL chosen as
    # utils.dist.torchrun_main chooses it. Without torchrun, launch runs gloo on the CPU.
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    gpu = "RANK" in os.environ and default_backend(local_world_size) == NCCL_BACKEND
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--world-size", type=int, default=2, help="ranks to start without torchrun (gloo)")
    parser.add_argument("--n-layers", type=int, default=16)
    parser.add_argument("--d-hidden", type=int, default=1024 if gpu else 64)
    parser.add_argument("--d-out", type=int, default=64 if gpu else 4)
    parser.add_argument("--batch-size", type=int, default=256 if gpu else 64, help="global batch")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--bucket-cap-mib", type=float, default=25.0 if gpu else 1 / 16)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before launch gives up (gloo)")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, strategies: Sequence[str], optimizer: str, lr: float
        ) -> tuple[harness.TrainConfig, int, dict[str, Any] | None]:
    """Run ``worker`` under torchrun when started by it, else through ``launch``; rank 0 gets the results."""
    if args.steps < 2:
        raise ValueError(f"--steps must be >= 2 (the first step is warm-up), got {args.steps}")
    config = harness.TrainConfig(n_layers=args.n_layers, d_hidden=args.d_hidden, d_out=args.d_out,
                            batch_size=args.batch_size, n_steps=args.steps, optimizer=optimizer, lr=lr)
    cap = int(args.bucket_cap_mib * 2**20)
    if "RANK" in os.environ:  # started by torchrun
        world_size = int(os.environ["WORLD_SIZE"])
        results = torchrun_main(worker, strategies, config, cap)
        return config, world_size, results if int(os.environ["RANK"]) == 0 else None
    results = launch(worker, args.world_size, strategies, config, cap, backend="gloo", timeout=args.timeout)
    return config, args.world_size, results[0]


def check_and_report(config: harness.TrainConfig, world_size: int, results: dict[str, Any]) -> dict[str, Any]:
    """Assert every strategy matches one process on the full batch; print calls and step times."""
    reference = harness.train_single_process(config)
    n_params = sum(p.numel() for p in harness.make_mlp(config).parameters())
    print(f"{world_size} ranks, {config.n_layers} layers of width {config.d_hidden}, {n_params} parameters, "
          f"{config.optimizer}, global batch {config.batch_size}, {config.n_steps} steps")
    if next(iter(results.values()))["device"].startswith("cuda"):  # where the ranks ran, not what the machine has
        print(f"device: {torch.cuda.get_device_name(0)}, NCCL (torch {torch.__version__}, CUDA {torch.version.cuda})")
    else:
        print(f"device: CPU, gloo (torch {torch.__version__}): these timings say nothing about GPU speed")
    for strategy, result in results.items():
        torch.testing.assert_close(result["weights"], reference["weights"], **TOLERANCE)
        calls = result["n_all_reduce_calls"]
        print(f"{strategy:>10}: matches one process | all-reduce calls per step: "
              f"{'-' if calls is None else calls:>3} | median step {1e3 * result['median_step_seconds']:8.2f} ms")
    return reference


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv, __doc__.splitlines()[0])
    config, world_size, results = run(args, ("naive", "bucketed", "torch_ddp"), "sgd", 0.2)
    if results is not None:
        check_and_report(config, world_size, results)


if __name__ == "__main__":
    main()
