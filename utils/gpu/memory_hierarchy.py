"""The memory levels of a GPU: size, bandwidth and latency of each, fastest first, with sources.

:func:`hierarchy` lists the places an SM can read data from: registers, the
L1 data cache / shared memory (one SRAM per SM), the L2 cache, HBM, the other
GPUs' memory over NVLink, and the host's memory over PCIe. Every figure says where it comes from and of which kind it
is (``"vendor"``, ``"derived"`` from vendor figures by a stated formula, or
``"measured"`` by a named microbenchmark study). Figures that
:mod:`utils.gpu.hardware` already holds (HBM size and bandwidth, L2 size, SM count,
registers per SM, NVLink bandwidth, FP32 peak) are read from there; the others
are in :data:`PUBLISHED`, one entry per number with its source.

Latencies were measured by pointer chasing (each load's address is the value
the previous load returned, so loads cannot overlap), the method of Jia et al.,
"Dissecting the NVIDIA Volta GPU Architecture via Microbenchmarking",
arXiv:1804.06826. NVIDIA publishes no latencies. Each latency is stored in the
cycles of the card that was measured *and* that card's clock, and converted
to seconds at that clock (:meth:`MemoryLevel.latency_seconds`), never at
another GPU's clock. The H100 figures come from one run of the ``gpu-latency``
benchmark of gpu-benches on an H100 PCIe at 1755 MHz (file
``gpu-latency/h100_pcie.txt``, read from the repository): L1 hit, near and far
L2 hit and DRAM; the DRAM figure is
:data:`utils.gpu.simt.POINTER_CHASE_DRAM_LATENCY` itself, so the latency and
memory pages use one number. The A100 figures are attributed to Luo et al.,
"Benchmarking and Dissecting the Nvidia Hopper GPU Architecture",
arXiv:2402.13499, on an A100 PCIe; the paper's tables could not be reached
from the environment that wrote this module, so they are unchecked.

How a warp's loads become 32-byte sectors is in :mod:`utils.gpu.coalescing`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from utils.gpu import hardware
from utils.gpu.hardware import KB
from utils.gpu.simt import POINTER_CHASE_DRAM_LATENCY
from utils.published import Published
from utils.validate import check_positive

LEVEL_NAMES = ("registers", "L1 / shared memory", "L2 cache", "HBM", "peer GPUs (NVLink)", "host memory (PCIe)")
"""The levels of :func:`hierarchy`, fastest first."""

SHARED_MEMORY_BANKS = 32
SHARED_MEMORY_BANK_BYTES_PER_CLOCK = 4
_BANKS_SOURCE = ("CUDA C++ Programming Guide, Shared Memory (compute capability 5.x and later): 32 banks, "
                 "each with a bandwidth of 32 bits per clock cycle")

_LUO = ("Luo et al., 'Benchmarking and Dissecting the Nvidia Hopper GPU Architecture', arXiv:2402.13499, "
        "pointer-chasing latency table (not checked: the paper's text could not be reached from the "
        "environment that wrote this table)")
_GPU_LATENCY = ("gpu-benches gpu-latency, gpu-latency/h100_pcie.txt (github.com/te42kyfo/gpu-benches): pointer "
                "chase on an H100 PCIe at 1755 MHz")
_H100_PCIE_DRAM = POINTER_CHASE_DRAM_LATENCY["H100-PCIe"]
_H100_WP = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022)"
_A100_WP = "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020)"


PUBLISHED: Mapping[str, Mapping[str, Published]] = MappingProxyType({
    "H100-SXM": MappingProxyType({
        "l1_smem_per_sm_bytes": Published(
            256 * KB, "bytes", f"{_H100_WP}: 256 KB of combined shared memory and L1 data cache per SM", "vendor"),
        "fp32_lanes_per_sm": Published(128, "lanes", f"{_H100_WP}, Table 3: 128 FP32 cores per SM", "vendor"),
        "l2_bytes_per_clock": Published(
            4472.3, "bytes/clock",
            "Luo et al., arXiv:2402.13499, L2 throughput table: FP32 loads on an H800 PCIe (GH100); not checked "
            "against the paper, whose text could not be reached from the environment that wrote this table. "
            "NVIDIA publishes no L2 bandwidth for H100", "measured"),
        "latency_clock_hz": Published(
            _H100_PCIE_DRAM.clock_hz, "Hz", f"{_GPU_LATENCY}: the clock of every row of the file", "measured"),
        "smem_latency_cycles": Published(
            34.2, "cycles", f"{_GPU_LATENCY}, L1 hit (buffers of 1 to 216 kB): 34.2 cycles = 19.5 ns", "measured"),
        "l2_latency_cycles": Published(
            265.5, "cycles", f"{_GPU_LATENCY}, L2 hit, near partition (buffers of 0.4 to 20 MB): 265.5 cycles "
            "= 151 ns", "measured"),
        "l2_far_latency_cycles": Published(
            475.4, "cycles", f"{_GPU_LATENCY}, plateau for buffers of 35 to 47 MB, past the ~20 MB "
            "near plateau and inside the 50 MB L2 (our reading: hits in the far L2 partition): about 475 "
            "cycles = 271 ns", "measured"),
        "hbm_latency_cycles": Published(
            _H100_PCIE_DRAM.cycles, "cycles", f"{_H100_PCIE_DRAM.source} (utils.gpu.simt.POINTER_CHASE_DRAM_LATENCY)",
            "measured"),
        "pcie_bidirectional_bytes_per_s": Published(
            128e9, "bytes/s",
            "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): 'PCIe Gen5: 128 GB/s' "
            "(64 GB/s each way; PCI-SIG PCI Express Base Specification 5.0, 32 GT/s x16)", "vendor"),
        "host_memory_bytes": Published(2e12, "bytes", "NVIDIA DGX H100 datasheet: 2 TB system memory", "vendor"),
        "gpus_per_node": Published(
            8, "GPUs per node", "NVIDIA DGX H100 / HGX H100 8-GPU: eight H100 SXM per node", "vendor"),
    }),
    "A100-SXM4-80GB": MappingProxyType({
        "l1_smem_per_sm_bytes": Published(
            192 * KB, "bytes", f"{_A100_WP}: 192 KB of combined shared memory and L1 data cache per SM", "vendor"),
        "fp32_lanes_per_sm": Published(64, "lanes", f"{_A100_WP}, Table 4: 64 FP32 cores per SM", "vendor"),
        "l2_bytes_per_clock": Published(
            5120, "bytes/clock", f"{_A100_WP}: 'The A100 L2 read bandwidth is 5120 Bytes/clk'", "vendor"),
        "latency_clock_hz": Published(
            1.41e9, "Hz", f"{_A100_WP}, Table 4: 1410 MHz boost clock, assumed to be the clock at which Luo et al. "
            "counted the cycles (the paper could not be checked)", "vendor"),
        "smem_latency_cycles": Published(29.0, "cycles", f"{_LUO}, A100 PCIe, shared memory", "measured"),
        "l2_latency_cycles": Published(261.5, "cycles", f"{_LUO}, A100 PCIe, L2 hit", "measured"),
        "hbm_latency_cycles": Published(466.3, "cycles", f"{_LUO}, A100 PCIe, global memory (L2 miss)", "measured"),
        "pcie_bidirectional_bytes_per_s": Published(
            64e9, "bytes/s",
            "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM column): 'PCIe Gen4: 64 GB/s' (32 GB/s each way)",
            "vendor"),
        "host_memory_bytes": Published(
            2e12, "bytes", "NVIDIA DGX A100 datasheet (640 GB system): 2 TB system memory", "vendor"),
        "gpus_per_node": Published(
            8, "GPUs per node", "NVIDIA DGX A100 / HGX A100 8-GPU: eight A100 SXM per node", "vendor"),
    }),
})
"""Numbers :mod:`utils.gpu.hardware` does not hold, per GPU, each with its source."""

GPUS = tuple(PUBLISHED)
"""GPUs whose hierarchy is sourced here."""


@dataclass(frozen=True)
class MemoryLevel:
    """One level of the hierarchy, as seen by the whole GPU.

    ``size_bytes`` is the total over the GPU (e.g. registers of all SMs);
    ``bandwidth_bytes_per_s`` the aggregate rate at which all SMs can read the
    level (for PCIe and NVLink: one direction); ``latency_cycles`` the
    pointer-chasing latency of one load in SM clock cycles of the measured card,
    whose clock is ``latency_clock_hz``, or None where no measurement is cited. ``*_kind`` is one of :data:`utils.published.KINDS`. ``per`` says
    whether the level belongs to one ``"GPU"`` or to the whole ``"node"``
    (host memory, the peer GPUs).
    """

    name: str
    size_bytes: float
    bandwidth_bytes_per_s: float
    latency_cycles: float | None
    size_source: str
    bandwidth_source: str
    latency_source: str | None
    size_kind: str
    bandwidth_kind: str
    latency_kind: str | None
    per: str = "GPU"
    latency_clock_hz: float | None = None

    def latency_seconds(self, clock_hz: float | None = None) -> float | None:
        """``latency_cycles / clock_hz`` (None where no latency is cited).

        By default ``clock_hz`` is ``latency_clock_hz``, the clock of the card on which the
        cycles were counted: cycles counted on one card are seconds only at that card's clock.
        """
        if clock_hz is None:
            clock_hz = self.latency_clock_hz
        if self.latency_cycles is None:
            return None
        check_positive("clock_hz", clock_hz)
        return self.latency_cycles / clock_hz


def _published(gpu: str) -> Mapping[str, Published]:
    if gpu not in PUBLISHED:
        raise ValueError(f"no memory-hierarchy figures for {gpu!r}; sourced GPUs: {', '.join(GPUS)}")
    return PUBLISHED[gpu]


def sm_clock_hz(gpu: str) -> float:
    """The SM clock at which the vendor's FP32 peak is quoted: ``fp32_flops / (2 * SMs * FP32 lanes per SM)``.

    (One fused multiply-add, 2 FLOPs, per lane per clock.) H100 SXM:
    66.9e12 / (2 * 132 * 128) = 1.98 GHz; A100: 19.5e12 / (2 * 108 * 64) = 1.41 GHz,
    the boost clock in the A100 whitepaper, Table 4.
    """
    figures = _published(gpu)
    g = hardware.spec(gpu)
    return g.flops("fp32") / (2 * g.sm_count * figures["fp32_lanes_per_sm"].value)


def register_bandwidth_bytes_per_s(gpu: str) -> float:
    """Operand bytes the FP32 units read from registers at peak: ``6 * fp32_flops``.

    Each FMA (2 FLOPs) reads three 4-byte operands, 12 bytes, so 6 bytes per
    FLOP. An upper bound on what the register file delivers to the FP32 units,
    derived from the vendor's FP32 peak.
    """
    return 6.0 * hardware.spec(gpu).flops("fp32")


def shared_memory_bandwidth_bytes_per_s(gpu: str) -> float:
    """Aggregate shared-memory bandwidth: ``32 banks * 4 bytes * SMs * clock``.

    32 banks of 4 bytes per clock per SM (CUDA C++ Programming Guide), times
    the SMs, times :func:`sm_clock_hz`. A100: 19.5 TB/s, which matches the
    "estimated around 19 TB/s" of the FlashAttention paper (Dao et al.,
    arXiv:2205.14135, section 2.1).
    """
    g = hardware.spec(gpu)
    return SHARED_MEMORY_BANKS * SHARED_MEMORY_BANK_BYTES_PER_CLOCK * g.sm_count * sm_clock_hz(gpu)


def _hardware_source(g: hardware.GpuSpec, keyword: str) -> str:
    """The first of ``g.sources`` that mentions ``keyword`` (all of them if none does)."""
    return next((src for src in g.sources if keyword in src), "; ".join(g.sources))


def hierarchy(gpu: str = "H100-SXM") -> tuple[MemoryLevel, ...]:
    """The levels of ``gpu``'s memory, fastest first (names in :data:`LEVEL_NAMES`).

    Sizes are totals over the GPU: registers ``= registers_per_sm * 4 bytes * SMs``,
    L1/shared ``= combined SRAM per SM * SMs``, host memory that of one DGX
    node, peer GPUs ``= (GPUs per node - 1) * HBM``. Bandwidths: registers and
    shared memory derived (see :func:`register_bandwidth_bytes_per_s`,
    :func:`shared_memory_bandwidth_bytes_per_s`), L2 ``= bytes per clock *``
    :func:`sm_clock_hz`, HBM from the datasheet, PCIe and NVLink one direction
    (half the datasheet's bidirectional figure).
    """
    p = _published(gpu)
    g = hardware.spec(gpu)
    sm = g.sm_count
    clock = sm_clock_hz(gpu)
    datasheet = _hardware_source(g, "datasheet")
    sms = f"{sm} SMs ({_hardware_source(g, 'SMs')})"
    clock_note = f"at the {clock / 1e9:.2f} GHz clock of the FP32 peak (sm_clock_hz)"
    l2_bw = p["l2_bytes_per_clock"]
    lat_clock = p["latency_clock_hz"].value
    levels = [
        MemoryLevel(
            "registers", g.registers_per_sm * 4 * sm, register_bandwidth_bytes_per_s(gpu), None,
            f"{g.registers_per_sm} 32-bit registers per SM ({hardware.CUDA_GUIDE}) x {sms}",
            "6 bytes per FP32 FLOP at the FP32 peak: three 4-byte operands per 2-FLOP FMA", None,
            "vendor", "derived", None),
        MemoryLevel(
            "L1 / shared memory", p["l1_smem_per_sm_bytes"].value * sm, shared_memory_bandwidth_bytes_per_s(gpu),
            p["smem_latency_cycles"].value,
            f"{p['l1_smem_per_sm_bytes'].source}; x {sm} SMs",
            f"{_BANKS_SOURCE}; x {sm} SMs {clock_note}",
            p["smem_latency_cycles"].source, "vendor", "derived", "measured", latency_clock_hz=lat_clock),
        MemoryLevel(
            "L2 cache", g.l2_bytes, l2_bw.value * clock, p["l2_latency_cycles"].value,
            _hardware_source(g, "L2"), f"{l2_bw.source}; {l2_bw.value:g} bytes/clock {clock_note}",
            p["l2_latency_cycles"].source, "vendor", "derived" if l2_bw.kind == "vendor" else "measured",
            "measured", latency_clock_hz=lat_clock),
        MemoryLevel(
            "HBM", g.hbm_bytes, g.hbm_bandwidth, p["hbm_latency_cycles"].value, datasheet, datasheet,
            p["hbm_latency_cycles"].source, "vendor", "vendor", "measured", latency_clock_hz=lat_clock),
        MemoryLevel(
            "peer GPUs (NVLink)", (p["gpus_per_node"].value - 1) * g.hbm_bytes, g.nvlink_bandwidth / 2, None,
            f"{p['gpus_per_node'].source}: the HBM of the other {p['gpus_per_node'].value - 1:g}",
            f"{datasheet} (NVLink bandwidth, both directions added); one direction is half",
            None, "derived", "vendor", None, per="node"),
        MemoryLevel(
            "host memory (PCIe)", p["host_memory_bytes"].value, p["pcie_bidirectional_bytes_per_s"].value / 2, None,
            p["host_memory_bytes"].source, p["pcie_bidirectional_bytes_per_s"].source,
            None, "vendor", "vendor", None, per="node"),
    ]
    return tuple(levels)


def level(gpu: str, name: str) -> MemoryLevel:
    """The level called ``name`` (one of :data:`LEVEL_NAMES`) of ``gpu``."""
    if name not in LEVEL_NAMES:
        raise ValueError(f"unknown level {name!r}; levels: {', '.join(LEVEL_NAMES)}")
    return next(lv for lv in hierarchy(gpu) if lv.name == name)
