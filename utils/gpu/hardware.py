"""Published figures of data-centre GPUs, the roofline, occupancy and Little's law.

Every number in :data:`GPUS` comes from the document named in its ``sources``
field (vendor documents, except the B200's SM count and L2 size, which are
device-reported). FLOP/s are *dense* (no 2:4 sparsity): NVIDIA datasheets
often print the sparse figure, twice the dense one, with a footnote.

Per-SM limits (registers, warps, blocks, shared memory) come from the CUDA C++
Programming Guide, "Features and Technical Specifications", table "Technical
Specifications per Compute Capability" (compute capability 7.0 for V100, 8.0
for A100, 9.0 for H100/H200, 10.0 for B200).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

from utils.validate import check_nonnegative, check_positive

KB = 1024
MB = 1024 * 1024
TERA = 1e12

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")
CUDA_GUIDE = "CUDA C++ Programming Guide, Technical Specifications per Compute Capability"

WARP_SIZE = 32
"""Threads per warp on every NVIDIA GPU so far (CUDA C++ Programming Guide, "SIMT Architecture")."""


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. Bandwidths in bytes/s, FLOP/s dense, sizes in bytes."""

    name: str
    compute_capability: str
    hbm_bytes: int
    hbm_bandwidth: float
    peak_flops: Mapping[str, float]
    sm_count: int
    l2_bytes: int
    smem_per_sm_bytes: int
    smem_per_block_max_bytes: int
    registers_per_sm: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    nvlink_bandwidth: float
    sources: tuple[str, ...] = field(default=())
    max_threads_per_block: int = 1024
    max_registers_per_thread: int = 255
    warp_size: int = WARP_SIZE

    def flops(self, precision: str) -> float:
        """Dense peak FLOP/s in ``precision``; ``ValueError`` if the chip has no such Tensor Core mode."""
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; allowed: {', '.join(PRECISIONS)}")
        if precision not in self.peak_flops:
            raise ValueError(f"{self.name} has no {precision} support; it offers {', '.join(self.peak_flops)}")
        return self.peak_flops[precision]


def _flops(**tflops: float) -> Mapping[str, float]:
    return MappingProxyType({k: v * TERA for k, v in tflops.items()})


_GPU_LIST = [
    GpuSpec(
        name="V100-SXM2", compute_capability="7.0", hbm_bytes=32 * 10**9, hbm_bandwidth=900e9,
        peak_flops=_flops(fp32=15.7, fp16=125.0), sm_count=80, l2_bytes=6 * MB,
        smem_per_sm_bytes=96 * KB, smem_per_block_max_bytes=96 * KB, registers_per_sm=65536,
        max_warps_per_sm=64, max_blocks_per_sm=32, nvlink_bandwidth=300e9,
        sources=("NVIDIA Tesla V100 GPU Architecture whitepaper (2017), Table 1: 80 SMs, 15.7 FP32 and 125 Tensor "
                 "TFLOPS, 6 MB L2",
                 "NVIDIA Tesla V100 datasheet (SXM2 column): 32 GB HBM2 at 900 GB/s, NVLink 300 GB/s", CUDA_GUIDE),
    ),
    GpuSpec(
        name="A100-SXM4-80GB", compute_capability="8.0", hbm_bytes=80 * 10**9, hbm_bandwidth=2039e9,
        peak_flops=_flops(fp32=19.5, tf32=156.0, fp16=312.0, bf16=312.0), sm_count=108, l2_bytes=40 * MB,
        smem_per_sm_bytes=164 * KB, smem_per_block_max_bytes=163 * KB, registers_per_sm=65536,
        max_warps_per_sm=64, max_blocks_per_sm=32, nvlink_bandwidth=600e9,
        sources=("NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column): 80 GB HBM2e, 2,039 GB/s, NVLink 600 GB/s",
                 "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 108 SMs, 40 MB L2", CUDA_GUIDE),
    ),
    _H100_SXM := GpuSpec(
        name="H100-SXM", compute_capability="9.0", hbm_bytes=80 * 10**9, hbm_bandwidth=3.35e12,
        peak_flops=_flops(fp32=66.9, tf32=494.7, fp16=989.4, bf16=989.4, fp8=1978.9), sm_count=132,
        l2_bytes=50 * MB, smem_per_sm_bytes=228 * KB, smem_per_block_max_bytes=227 * KB,
        registers_per_sm=65536, max_warps_per_sm=64, max_blocks_per_sm=32, nvlink_bandwidth=900e9,
        sources=("NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): 80 GB, 3.35 TB/s, NVLink 900 GB/s",
                 "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), Table 3: 132 SMs, 50 MB L2, "
                 "dense Tensor TFLOPS", CUDA_GUIDE),
    ),
    # The H200 is the H100's chip with more and faster HBM (HBM3e): only memory and sources differ.
    replace(
        _H100_SXM, name="H200", hbm_bytes=141 * 10**9, hbm_bandwidth=4.8e12,
        sources=("NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column): 141 GB HBM3e, 4.8 TB/s, "
                 "the same Tensor Core peaks as H100 SXM (sparse figures halved)", CUDA_GUIDE),
    ),
    GpuSpec(
        name="B200", compute_capability="10.0", hbm_bytes=180 * 10**9, hbm_bandwidth=8e12,
        peak_flops=_flops(fp32=75.0, tf32=1125.0, fp16=2250.0, bf16=2250.0, fp8=4500.0), sm_count=148,
        l2_bytes=129536 * KB, smem_per_sm_bytes=228 * KB, smem_per_block_max_bytes=227 * KB,
        registers_per_sm=65536, max_warps_per_sm=64, max_blocks_per_sm=32, nvlink_bandwidth=1.8e12,
        sources=("NVIDIA HGX B200 specifications, per 8 GPUs: FP8 72 PFLOPS, FP16/BF16 36 PFLOPS and TF32 "
                 "18 PFLOPS with sparsity, FP32 600 TFLOPS; divided by 8 GPUs and by 2 for dense; NVLink 5 "
                 "1.8 TB/s per GPU",
                 "NVIDIA DGX B200 product page: 1,440 GB total GPU memory, 64 TB/s HBM3e bandwidth (8 GPUs), "
                 "i.e. 180 GB and 8 TB/s per GPU. NVIDIA's GB200 NVL72 / HGX B200 specification table "
                 "gives 7.7 TB/s per HGX B200 GPU instead; the book uses 8 TB/s",
                 "SM count and L2 size as reported by cudaGetDeviceProperties on B200 "
                 "(multiProcessorCount 148, l2CacheSize 129,536 KiB = 126.5 MiB), as printed by public "
                 "device-query logs; NVIDIA's datasheets do not list them",
                 CUDA_GUIDE),
    ),
]

GPUS: Mapping[str, GpuSpec] = MappingProxyType({g.name: g for g in _GPU_LIST})
"""All known GPUs by name."""


def spec(name: str | GpuSpec) -> GpuSpec:
    """The :class:`GpuSpec` of GPU ``name`` (one of :data:`GPUS`); a :class:`GpuSpec` is returned as it is, so that
    a calculator taking a GPU's name also takes a machine described by its own measured rates."""
    if isinstance(name, GpuSpec):
        return name
    if name not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)}")
    return GPUS[name]


def attainable_flops(intensity: float, peak_flops: float, peak_bandwidth: float) -> float:
    """The roofline: ``min(peak_flops, intensity * peak_bandwidth)`` FLOP/s.

    ``intensity`` is arithmetic intensity in FLOPs per byte moved to or from
    memory (Williams, Waterman and Patterson, "Roofline: an insightful visual
    performance model for multicore architectures", CACM 2009).
    """
    check_nonnegative("intensity (FLOPs/byte)", intensity)
    check_positive("peak_flops (FLOP/s)", peak_flops)
    check_positive("peak_bandwidth (bytes/s)", peak_bandwidth)
    return min(peak_flops, intensity * peak_bandwidth)


# Allocation rules of the CUDA Occupancy Calculator (CUDA toolkit, "CUDA_Occupancy_Calculator.xls"),
# shared by compute capabilities 7.0 to 10.0.
REGISTER_ALLOCATION_UNIT = 256  # registers, allocated per warp
WARP_SCHEDULERS_PER_SM = 4  # the register file is split across the four SM sub-partitions
SMEM_ALLOCATION_UNIT_BYTES = 128
SMEM_RESERVED_PER_BLOCK_BYTES = {"7.0": 0, "8.0": 1 * KB, "9.0": 1 * KB, "10.0": 1 * KB}


@dataclass(frozen=True)
class Occupancy:
    """Resident blocks per SM under each limit, the binding one, and the resulting occupancy."""

    blocks_by_warps: int
    blocks_by_registers: int
    blocks_by_smem: int
    blocks_by_block_limit: int
    active_blocks: int
    active_warps: int
    max_warps: int
    limiter: str

    @property
    def fraction(self) -> float:
        """Active warps / maximum resident warps per SM."""
        return self.active_warps / self.max_warps


def occupancy_report(threads_per_block: int, registers_per_thread: int, smem_per_block_bytes: int,
                     gpu: str = "H100-SXM") -> Occupancy:
    """Blocks and warps resident on one SM, and which resource limits them.

    Follows the CUDA Occupancy Calculator: a block of T threads occupies
    ceil(T/32) warps; registers are allocated per warp in units of 256 from
    each sub-partition's quarter of the register file; shared memory is
    allocated per block in units of 128 bytes plus a reserved 1 KB (compute
    capability 8.0 and later). Resident blocks = the minimum over the warp,
    register, shared-memory and block-count limits.
    """
    g = spec(gpu)
    for value, what in ((threads_per_block, "threads_per_block"), (registers_per_thread, "registers_per_thread"),
                        (smem_per_block_bytes, "smem_per_block_bytes")):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{what} must be an int, got {value!r}")
    if not 1 <= threads_per_block <= g.max_threads_per_block:
        raise ValueError(f"threads_per_block must be in 1..{g.max_threads_per_block} on {gpu}, got {threads_per_block}")
    if not 1 <= registers_per_thread <= g.max_registers_per_thread:
        raise ValueError(f"registers_per_thread must be in 1..{g.max_registers_per_thread}, got {registers_per_thread}")
    if not 0 <= smem_per_block_bytes <= g.smem_per_block_max_bytes:
        raise ValueError(f"smem_per_block_bytes must be in 0..{g.smem_per_block_max_bytes} on {gpu}, "
                         f"got {smem_per_block_bytes}")

    warps_per_block = math.ceil(threads_per_block / g.warp_size)
    blocks_by_warps = g.max_warps_per_sm // warps_per_block

    registers_per_warp = math.ceil(registers_per_thread * g.warp_size / REGISTER_ALLOCATION_UNIT) \
        * REGISTER_ALLOCATION_UNIT
    warps_by_registers = WARP_SCHEDULERS_PER_SM * (
        (g.registers_per_sm // WARP_SCHEDULERS_PER_SM) // registers_per_warp)
    blocks_by_registers = warps_by_registers // warps_per_block

    smem_block = math.ceil((smem_per_block_bytes + SMEM_RESERVED_PER_BLOCK_BYTES[g.compute_capability])
                           / SMEM_ALLOCATION_UNIT_BYTES) * SMEM_ALLOCATION_UNIT_BYTES
    blocks_by_smem = g.smem_per_sm_bytes // smem_block if smem_block else sys.maxsize

    # On a tie, the first limit listed is reported.
    limits = {"warps": blocks_by_warps, "registers": blocks_by_registers,
              "blocks": g.max_blocks_per_sm, "shared memory": blocks_by_smem}
    limiter = min(limits, key=limits.get)
    active_blocks = limits[limiter]
    return Occupancy(blocks_by_warps, blocks_by_registers, blocks_by_smem, g.max_blocks_per_sm,
                     active_blocks, active_blocks * warps_per_block, g.max_warps_per_sm, limiter)


def occupancy(threads_per_block: int, registers_per_thread: int, smem_per_block_bytes: int,
              gpu: str = "H100-SXM") -> float:
    """Fraction of the SM's maximum resident warps that a kernel's launch keeps resident.

    See :func:`occupancy_report` for the rules and for which resource binds.
    """
    return occupancy_report(threads_per_block, registers_per_thread, smem_per_block_bytes, gpu).fraction


def bytes_in_flight(bandwidth_bytes_per_s: float, latency_seconds: float) -> float:
    """Little's law: bytes that must be in flight to sustain a bandwidth, ``bandwidth * latency``.

    (Little, "A proof for the queuing formula L = lambda W", Operations Research
    1961; applied to GPUs in Volkov, "Understanding Latency Hiding on GPUs",
    PhD thesis, UC Berkeley 2016.)
    """
    check_nonnegative("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    check_nonnegative("latency_seconds", latency_seconds)
    return bandwidth_bytes_per_s * latency_seconds


def spec_for_device(device_name: str) -> GpuSpec | None:
    """The spec matching a driver-reported name (``torch.cuda.get_device_name()``), or None if unknown.

    "NVIDIA H100 80GB HBM3" -> H100-SXM; "NVIDIA H200" -> H200; "NVIDIA A100-SXM4-80GB" ->
    A100-SXM4-80GB; "NVIDIA B200" -> B200; "Tesla V100-SXM2-32GB" -> V100-SXM2. PCIe and
    other variants (e.g. "H100 PCIe", "A100-PCIE-40GB") have other peaks and return None.
    """
    name = device_name.upper()
    if "PCIE" in name or "NVL" in name:
        return None
    for key, gpu in (("H200", "H200"), ("B200", "B200"), ("H100", "H100-SXM"),
                     ("A100-SXM4-80GB", "A100-SXM4-80GB"), ("V100-SXM2", "V100-SXM2")):
        if key in name:
            return GPUS[gpu]
    return None
