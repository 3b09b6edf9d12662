"""Tensor Cores: what one instruction computes, the peak it adds up to, and what a GEMM loses to quantization.

Three ideas of the chapter ``chapters/01-gpu-architecture/06-tensor-cores``:

- :data:`MMA_INSTRUCTIONS`: the shapes of the Tensor Core instructions of the
  PTX ISA (warp-level ``mma.sync``, Hopper's warpgroup-level ``wgmma``), and
  :func:`mma_instructions`, how many of them a GEMM issues.
- :data:`TENSOR_CORE_RATES` and :func:`tensor_core_peak_flops`: the dense
  fp16 peak rebuilt as SMs x Tensor Cores per SM x FLOPs per clock per
  Tensor Core x the clock at which the vendor quotes it.
- Tile and wave quantization (NVIDIA, "Matrix Multiplication Background
  User's Guide", DU-09799-001, chapter 3 "Dimension Quantization Effects"):
  :func:`tile_quantization_efficiency`, :func:`wave_quantization_efficiency`,
  and, for Hopper's thread-block clusters with TMA multicast,
  :func:`cluster_tile_intensity`.

The arithmetic intensity of one tile is :func:`utils.kernels.matmul.tile_intensity`
(one definition in the package); :func:`cluster_tile_intensity` reduces to it
for a cluster of one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from utils.gpu import hardware
from utils.published import Published
from utils.validate import check_element_size, check_positive_int

PTX_ISA = "NVIDIA PTX ISA, 'Warp Level Matrix Multiply-Accumulate Instructions'"
CUTLASS_WARP = ("CUTLASS CuTe DSL docs, cute.nvgpu.warp.MmaF16BF16Op: F16/BF16 Mma-MNK (16,8,8), (16,8,16), "
                "sm_80+; 'mma.sync.aligned is a warp-collective synchronous operation'")
CUTLASS_WGMMA = ("CUTLASS CuTe DSL docs, cute.nvgpu.warpgroup.MmaF16BF16Op: Mma-M = 64, 8 <= Mma-N <= 256 "
                 "step 8, Mma-K = 16 for F16/BF16, sm_90a; 'WGMMA is asynchronous and collective at "
                 "warpgroup scope (4 contiguous warps)'; B from shared memory through a descriptor, A from "
                 "shared memory or registers")


@dataclass(frozen=True)
class MmaInstruction:
    """One Tensor Core instruction: ``D (m x n) = A (m x k) @ B (k x n) + C``, issued by ``threads`` threads."""

    name: str
    m: int
    n: int
    k: int
    threads: int
    arch: str
    source: str

    @property
    def flops(self) -> int:
        """``2 m n k``: a multiply and an add per term."""
        return 2 * self.m * self.n * self.k


MMA_INSTRUCTIONS: Mapping[str, MmaInstruction] = MappingProxyType({
    i.name: i for i in (
        MmaInstruction("mma.sync.m8n8k4 (fp16)", 8, 8, 4, 8, "sm_70 (Volta)",
                       f"{PTX_ISA}: 'A warp executing mma.sync.m8n8k4 instruction computes 4 matrix multiply "
                       "and accumulate operations', so each 8x8x4 product belongs to 8 of the warp's 32 threads"),
        MmaInstruction("mma.sync.m16n8k16 (fp16)", 16, 8, 16, 32, "sm_80+ (Ampere, Hopper)",
                       f"{PTX_ISA}; {CUTLASS_WARP}"),
        MmaInstruction("wgmma.mma_async.m64n256k16 (fp16)", 64, 256, 16, 128, "sm_90a (Hopper)",
                       f"PTX ISA, 'Asynchronous Warpgroup Level Matrix Multiply-Accumulate'; {CUTLASS_WGMMA}"),
    )
})
"""Tensor Core instruction shapes for fp16 inputs, by PTX name. ``wgmma`` takes any n = 8, 16, ..., 256."""


@dataclass(frozen=True)
class TensorCoreRate:
    """Dense fp16 Tensor Core throughput of one GPU, and the clock at which its peak is quoted."""

    tensor_cores_per_sm: Published
    fma_per_clock_per_tensor_core: Published
    tensor_clock_hz: Published


_FORUM = ("NVIDIA developer forum, 'How to calculate the Tensor Core FP16 performance of H100?' (2023), "
          "answer by Robert Crovella")
_H100_WP = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022)"

TENSOR_CORE_RATES: Mapping[str, TensorCoreRate] = MappingProxyType({
    "V100-SXM2": TensorCoreRate(
        Published(8, "Tensor Cores per SM", "NVIDIA Tesla V100 GPU Architecture whitepaper (2017): 8 Tensor Cores "
                  "per SM", "vendor"),
        Published(64, "FMA/clock", "V100 whitepaper: 64 fp16 FMA (mixed precision) per clock per Tensor "
                  "Core, 1024 FLOPs per clock per SM", "vendor"),
        Published(1.53e9, "Hz", "V100 whitepaper, Table 1: GPU boost clock 1530 MHz (V100 SXM2)", "vendor"),
    ),
    "A100-SXM4-80GB": TensorCoreRate(
        Published(4, "Tensor Cores per SM", "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): four "
                  "third-generation Tensor Cores per SM", "vendor"),
        Published(256, "FMA/clock", "A100 whitepaper: 256 dense FP16/FP32 FMA operations per clock per Tensor "
                  "Core, 1024 per SM", "vendor"),
        Published(1.41e9, "Hz", "A100 whitepaper, Table 4: boost clock 1410 MHz", "vendor"),
    ),
    "H100-SXM": TensorCoreRate(
        Published(4, "Tensor Cores per SM", f"{_H100_WP}, Table 3: 528 Tensor Cores for 132 SMs", "vendor"),
        Published(512, "FMA/clock", f"{_H100_WP}: the H100 SM doubles the A100 SM's dense MMA rate clock for "
                  "clock (A100: 1024 FP16 FMA/clock/SM), so 2048 FMA = 4096 FLOP per clock per SM, 512 FMA "
                  f"per Tensor Core ({_FORUM})", "derived"),
        Published(1.83e9, "Hz", f"{_H100_WP}, Table 3: boost clock for the Tensor Core peaks, 1830 MHz on H100 "
                  f"SXM5 (1620 MHz on H100 PCIe, quoted from that table in {_FORUM}); the FP32 peak is quoted "
                  "at 1980 MHz (utils.gpu.memory_hierarchy.sm_clock_hz). Table 3 is an image in the PDF; the value "
                  "is confirmed by the forum answer and by the product 132 SMs x 4096 FLOP x 1.83 GHz = 989.4 "
                  "TFLOP/s, Table 3's dense BF16 peak", "vendor"),
    ),
})
"""Per-GPU Tensor Core counts, dense fp16 rates and quoted clocks, each with its source."""


def tensor_core_peak_flops(gpu: str = "H100-SXM") -> float:
    """Dense fp16 Tensor Core peak: ``SMs * TCs per SM * 2 * FMA per clock per TC * clock`` (FLOP/s).

    H100 SXM: 132 * 4 * 2 * 512 * 1.83e9 = 989.4e12, the 989.4 dense TFLOP/s
    of the whitepaper (the datasheet's 1,979 is the 2:4-sparse figure).
    """
    if gpu not in TENSOR_CORE_RATES:
        raise ValueError(f"no Tensor Core rates for {gpu!r}; known: {', '.join(TENSOR_CORE_RATES)}")
    r = TENSOR_CORE_RATES[gpu]
    return (hardware.spec(gpu).sm_count * r.tensor_cores_per_sm.value * 2 * r.fma_per_clock_per_tensor_core.value
            * r.tensor_clock_hz.value)


def mma_instructions(m: int, n: int, k: int, instruction: str) -> int:
    """Instructions of shape ``instruction`` (a key of :data:`MMA_INSTRUCTIONS`) that an ``m x n x k`` GEMM issues.

    ``ceil(m / im) * ceil(n / in) * ceil(k / ik)``: the output is covered by
    ``im x in`` fragments and each walks ``k`` in steps of ``ik``.
    """
    for name, value in (("m", m), ("n", n), ("k", k)):
        check_positive_int(name, value)
    if instruction not in MMA_INSTRUCTIONS:
        raise ValueError(f"unknown instruction {instruction!r}; known: {', '.join(MMA_INSTRUCTIONS)}")
    i = MMA_INSTRUCTIONS[instruction]
    return math.ceil(m / i.m) * math.ceil(n / i.n) * math.ceil(k / i.k)


def n_tiles(m: int, n: int, tile_m: int, tile_n: int) -> int:
    """Output tiles (thread blocks) of an ``m x n`` output in ``tile_m x tile_n`` tiles: ``ceil(m/tm) * ceil(n/tn)``."""
    for name, value in (("m", m), ("n", n), ("tile_m", tile_m), ("tile_n", tile_n)):
        check_positive_int(name, value)
    return math.ceil(m / tile_m) * math.ceil(n / tile_n)


def tile_quantization_efficiency(m: int, n: int, tile_m: int, tile_n: int) -> float:
    """Useful fraction of the work of the tiles: ``m * n / (ceil(m/tm) tm * ceil(n/tn) tn)``.

    Tile quantization (Matrix Multiplication Background User's Guide, section
    3.1): every tile does a full tile's work, so edge tiles that stick out of
    the matrix waste the part outside it. 1.0 when the tiles divide ``m`` and ``n``.
    """
    tiles = n_tiles(m, n, tile_m, tile_n)
    return m * n / (tiles * tile_m * tile_n)


def waves(n_tiles: int, n_sms: int, tiles_per_sm: int = 1) -> int:
    """Waves of thread blocks: ``ceil(n_tiles / (n_sms * tiles_per_sm))``."""
    for name, value in (("n_tiles", n_tiles), ("n_sms", n_sms), ("tiles_per_sm", tiles_per_sm)):
        check_positive_int(name, value)
    return math.ceil(n_tiles / (n_sms * tiles_per_sm))


def wave_quantization_efficiency(n_tiles: int, n_sms: int, tiles_per_sm: int = 1) -> float:
    """Busy fraction of the SM slots over the waves: ``n_tiles / (waves * n_sms * tiles_per_sm)``.

    Wave quantization (Matrix Multiplication Background User's Guide, section
    3.2): ``n_sms * tiles_per_sm`` tiles run at once (a wave); the last wave
    may be partly empty, yet it takes as long as a full one. 133 tiles on 132
    SMs need two waves: 133 / 264 = 50.4 %.
    """
    return n_tiles / (waves(n_tiles, n_sms, tiles_per_sm) * n_sms * tiles_per_sm)


def cluster_tile_intensity(block_m: int, block_n: int, element_size: int, cluster_m: int = 1,
                           cluster_n: int = 1) -> float:
    """FLOPs per byte read from L2 per tile, when a cluster of CTAs shares its operand blocks by TMA multicast.

    A cluster of ``cluster_m x cluster_n`` tiles: the ``cluster_n`` tiles of a
    row need the same block of A, the ``cluster_m`` tiles of a column the same
    block of B. With multicast one L2 read fills the shared memory of all of
    them, so per tile and K-step of ``BK``:

        intensity = 2 BM BN BK / ((BM BK / cluster_n + BK BN / cluster_m) s)
                  = 2 BM BN / ((BM / cluster_n + BN / cluster_m) s).

    A cluster of one is :func:`utils.kernels.matmul.tile_intensity`:
    ``2 BM BN / ((BM + BN) s)``, 64 FLOP/byte for 128 x 128 fp16 tiles.
    """
    for name, value in (("block_m", block_m), ("block_n", block_n), ("cluster_m", cluster_m),
                        ("cluster_n", cluster_n)):
        check_positive_int(name, value)
    check_element_size(element_size)
    return 2 * block_m * block_n / ((block_m / cluster_n + block_n / cluster_m) * element_size)
