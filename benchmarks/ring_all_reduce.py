"""Time the book's ring all-reduce against the library's all-reduce, on GPUs or CPUs.

On a GPU machine (NCCL, one process per GPU; ``utils.dist.torchrun_main`` picks
gloo instead if there are fewer GPUs than processes):

    torchrun --nproc-per-node=8 -m benchmarks.ring_all_reduce

On a CPU (gloo), with the book's launcher instead of torchrun:

    python -m benchmarks.ring_all_reduce --cpu-ranks 4

Prints, per message size, the median time of each, the algorithm bandwidth
(bytes / time) and the bus bandwidth (algbw x 2(n-1)/n, as nccl-tests reports
it: see nccl-tests' doc/PERFORMANCE.md).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from benchmarks.collectives import median_collective_seconds
from utils.dist import launch, torchrun_main
from utils.dist_policy import worker_device
from utils.parallel.comm.bandwidth import algorithm_bandwidth, allreduce_bus_bandwidth
from utils.parallel.comm.collectives import ring_all_reduce


def bench_worker(rank: int, world_size: int, sizes_bytes: list[int], repeats: int) -> list[dict]:
    """Time ring_all_reduce and dist.all_reduce for each message size; rank 0 prints a table."""
    device = worker_device()  # this rank's GPU when the group has NCCL (torchrun on GPUs), else the CPU
    rows = []
    for nbytes in sizes_bytes:
        x = torch.ones(nbytes // 4, device=device)
        ring = median_collective_seconds(lambda: ring_all_reduce(x), repeats, x.is_cuda)
        library = median_collective_seconds(lambda: dist.all_reduce(x), repeats, x.is_cuda)
        rows.append(dict(nbytes=nbytes, ring_s=ring, library_s=library,
                         ring_busbw=allreduce_bus_bandwidth(algorithm_bandwidth(nbytes, ring), world_size),
                         library_busbw=allreduce_bus_bandwidth(algorithm_bandwidth(nbytes, library), world_size)))
    if rank == 0:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        print(f"{world_size} ranks, backend {dist.get_backend()}, {name}, torch {torch.__version__}")
        print(f"{'size':>10} {'ring (ms)':>10} {'busbw GB/s':>11} {'library (ms)':>13} {'busbw GB/s':>11}")
        for r in rows:
            print(f"{r['nbytes'] / 2**10:8.0f}Ki {r['ring_s'] * 1e3:10.3f} {r['ring_busbw'] / 1e9:11.2f} "
                  f"{r['library_s'] * 1e3:13.3f} {r['library_busbw'] / 1e9:11.2f}")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-ranks", type=int, default=0, help="run on this many gloo processes instead of torchrun")
    parser.add_argument("--max-mib", type=int, default=256, help="largest message, in MiB")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    sizes = [2**k for k in range(12, 20 + args.max_mib.bit_length())]  # 4 KiB .. max_mib MiB
    if args.cpu_ranks:
        launch(bench_worker, args.cpu_ranks, sizes, args.repeats, backend="gloo", timeout=600)
    else:
        torchrun_main(bench_worker, sizes, args.repeats)


if __name__ == "__main__":
    main()
