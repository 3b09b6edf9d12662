"""Part 2, parallelism: training on many GPUs, the collectives it needs and the networks that carry them.

Modules (import each by its path, e.g. ``from utils.parallel.network import
ring_allreduce_time``; nothing is re-exported here):

- :mod:`utils.parallel.training`: training FLOPs (6ND), training time, MFU;
- :mod:`utils.parallel.collectives`: the ring all-reduce built from send/recv;
- :mod:`utils.parallel.network`: alpha-beta cost models of all-reduce algorithms;
- :mod:`utils.parallel.topology`: switch fabrics, their size and wiring;
- :mod:`utils.parallel.data_parallel`: DDP, bucketing, ZeRO-1 and FSDP2 reference implementations;
- :mod:`utils.parallel.memory`: ZeRO's model-state memory and traffic per GPU;
- :mod:`utils.parallel.overlap`: how much of DDP's all-reduce hides behind backward.

Used by the chapters of ``chapters/02-parallelism/`` (01 why many GPUs:
training, memory; 02 collectives: network; 03 DP and DDP: network, overlap;
04 ZeRO and FSDP: memory; 05 GPU networking: topology), by the labs of
``labs/02-parallelism/`` (01 ring all-reduce: collectives, network; 02 DDP from
scratch: data_parallel, network; 03 ZeRO and FSDP: data_parallel, memory) and
by the multi-process benchmarks in ``benchmarks/``.
"""
