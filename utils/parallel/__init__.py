"""Part 2, parallelism: training on many GPUs, the collectives it needs and the networks that carry them.

Modules (import each by its path, e.g. ``from utils.parallel.network import
ring_allreduce_time``; nothing is re-exported here):

- :mod:`utils.parallel.training`: training FLOPs (6ND), training time, MFU;
- :mod:`utils.parallel.collectives`: the ring all-reduce built from send/recv;
- :mod:`utils.parallel.network`: alpha-beta cost models of all-reduce, on one
  level and across NVLink and a scale-out fabric;
- :mod:`utils.parallel.bandwidth`: link rates in Gb/s to bytes/s, and
  nccl-tests' algorithm and bus bandwidth;
- :mod:`utils.parallel.topology`: switch fabrics (Clos, fat tree), their size
  and cost, and the published figures of real ones;
- :mod:`utils.parallel.wiring`: every cable of a small fabric, shortest paths,
  ECMP collisions;
- :mod:`utils.parallel.data_parallel`: gradient all-reduce, DDP's bucketing
  rule and bucketed DDP, ZeRO-1, bytes held per rank;
- :mod:`utils.parallel.harness`: a tiny training run on one process or on N
  ranks with any strategy (ours, PyTorch DDP, FSDP2), the labs' yardstick;
- :mod:`utils.parallel.memory`: ZeRO's model-state memory and traffic per GPU;
- :mod:`utils.parallel.overlap`: how much of DDP's all-reduce hides behind backward.

Used by the chapters of ``chapters/02-parallelism/``: 01 why many GPUs
(training, memory), 02 collectives (network, bandwidth), 03 DP and DDP
(data_parallel, network, bandwidth, overlap), 04 ZeRO and FSDP (memory,
data_parallel), 05 GPU networking (topology, wiring, bandwidth, network); by
the labs of ``labs/02-parallelism/``: 01 ring all-reduce (collectives,
network), 02 DDP from scratch (data_parallel, harness, network), 03 ZeRO and
FSDP (data_parallel, harness, memory); and by the multi-process benchmarks in
``benchmarks/``.
"""
