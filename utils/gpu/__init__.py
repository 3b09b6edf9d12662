"""Part 1, GPU architecture: what one GPU holds and how fast it can go.

Modules (import each by its path, e.g. ``from utils.gpu.hardware import spec``;
nothing is re-exported here):

- :mod:`utils.gpu.hardware`: the GPU spec table with its sources, the roofline
  bound, occupancy, Little's law;
- :mod:`utils.gpu.simt`: branch divergence, and the warps needed to hide memory latency;
- :mod:`utils.gpu.memory_hierarchy`: the memory levels of a GPU (size,
  bandwidth, latency), each figure sourced;
- :mod:`utils.gpu.coalescing`: how a warp's loads become 32-byte sectors;
- :mod:`utils.gpu.shared_memory`: shared-memory banks and bank conflicts
  (padding, XOR swizzling);
- :mod:`utils.gpu.roofline`: arithmetic intensity of transformer operations and
  where they land on a roofline;
- :mod:`utils.gpu.overhead`: compute, memory or overhead: splitting a measured time,
  fitting a per-operation overhead and a bandwidth, published kernel-launch figures;
- :mod:`utils.gpu.tensor_cores`: the Tensor Core instructions, the peak they add up
  to, tile and wave quantization, a tile's intensity against L2.

Used by the chapters of ``chapters/01-gpu-architecture/``: 01 latency vs
throughput (hardware, simt), 02 inside an SM (hardware, simt,
memory_hierarchy), 03 memory hierarchy (hardware, memory_hierarchy,
coalescing, shared_memory), 04 rooflines (hardware, roofline, memory_hierarchy), 05 where the time goes
(hardware, roofline, overhead), 06 tensor cores (hardware, tensor_cores,
memory_hierarchy); by the labs
of ``labs/01-gpu-architecture/`` (the peaks of :mod:`utils.gpu.hardware`, and
the ridge point of :mod:`utils.gpu.roofline` in the tiled-matmul lab); by
``chapters/02-parallelism/01-why-many-gpus`` (GPU peaks and memory); and by
``benchmarks/gpu_architecture.py``. The Triton kernels of the part-1 labs live
in :mod:`utils.kernels`.
"""
