"""utils.gpu.memory_hierarchy: each level against the whitepapers and datasheets, every figure sourced."""

import pytest

from utils.gpu import hardware
from utils.gpu import memory_hierarchy as mh
from utils.published import KINDS


def test_h100_levels_match_the_whitepaper_and_datasheet():
    levels = {lv.name: lv for lv in mh.hierarchy("H100-SXM")}
    assert tuple(levels) == mh.LEVEL_NAMES
    # H100 whitepaper: 64K 32-bit registers (256 KB) and 256 KB of L1/shared memory per SM, 132 SMs, 50 MB L2.
    assert levels["registers"].size_bytes == 256 * 1024 * 132
    assert levels["L1 / shared memory"].size_bytes == 256 * 1024 * 132
    assert levels["L2 cache"].size_bytes == 50 * 2**20
    # H100 SXM datasheet: 80 GB HBM3 at 3.35 TB/s; PCIe Gen5 128 GB/s and NVLink 900 GB/s, both bidirectional.
    assert levels["HBM"].size_bytes == 80e9
    assert levels["HBM"].bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert levels["host memory (PCIe)"].bandwidth_bytes_per_s == pytest.approx(64e9)
    assert levels["peer GPUs (NVLink)"].bandwidth_bytes_per_s == pytest.approx(450e9)


def test_clock_derived_from_the_fp32_peak_matches_the_published_boost_clocks():
    assert mh.sm_clock_hz("A100-SXM4-80GB") == pytest.approx(1.41e9, rel=1e-3)  # A100 whitepaper: 1410 MHz boost
    assert mh.sm_clock_hz("H100-SXM") == pytest.approx(1.98e9, rel=1e-3)  # H100 SXM: 1980 MHz max clock


def test_a100_shared_memory_bandwidth_matches_the_flashattention_estimate():
    # Dao et al., arXiv:2205.14135, section 2.1: A100 SRAM "bandwidth estimated around 19TB/s".
    assert mh.shared_memory_bandwidth_bytes_per_s("A100-SXM4-80GB") == pytest.approx(19e12, rel=0.05)


def test_a100_l2_bandwidth_is_5120_bytes_per_clock():
    l2 = mh.level("A100-SXM4-80GB", "L2 cache")
    assert l2.bandwidth_bytes_per_s == pytest.approx(5120 * 1.41e9, rel=1e-3)
    assert l2.bandwidth_kind == "derived"


@pytest.mark.parametrize("gpu", mh.GPUS)
def test_each_level_is_bigger_and_slower_than_the_one_before(gpu):
    levels = mh.hierarchy(gpu)
    for faster, slower in zip(levels, levels[1:]):
        assert slower.bandwidth_bytes_per_s < faster.bandwidth_bytes_per_s, (faster.name, slower.name)
    # Registers and L1 are about the same size; from L1 on, every level is larger.
    for smaller, larger in zip(levels[1:], levels[2:]):
        assert larger.size_bytes > smaller.size_bytes, (smaller.name, larger.name)
    latencies = [lv.latency_cycles for lv in levels if lv.latency_cycles is not None]
    assert latencies == sorted(latencies) and len(latencies) == 3


@pytest.mark.parametrize("gpu", mh.GPUS)
def test_every_figure_has_a_source_and_a_kind(gpu):
    for figure in mh.PUBLISHED[gpu].values():
        assert figure.source and figure.kind in KINDS and figure.value > 0
    for lv in mh.hierarchy(gpu):
        assert lv.size_source and lv.bandwidth_source
        assert lv.size_kind in KINDS and lv.bandwidth_kind in KINDS
        assert (lv.latency_cycles is None) == (lv.latency_source is None) == (lv.latency_kind is None)


def test_figures_held_by_utils_hardware_are_not_copied():
    for gpu in mh.GPUS:
        assert mh.level(gpu, "HBM").bandwidth_bytes_per_s == hardware.spec(gpu).hbm_bandwidth
        assert mh.level(gpu, "L2 cache").size_bytes == hardware.spec(gpu).l2_bytes


def test_latency_in_seconds_at_the_clock_of_the_measured_card():
    hbm = mh.level("H100-SXM", "HBM")
    # gpu-benches, gpu-latency/h100_pcie.txt, largest buffer: 658.4 cycles at 1755 MHz (= 375 ns).
    assert hbm.latency_seconds() == pytest.approx(658.4 / 1755e6)
    assert hbm.latency_seconds() == pytest.approx(375e-9, rel=0.01)
    assert hbm.latency_seconds(1e9) == pytest.approx(658.4e-9)
    assert mh.level("H100-SXM", "registers").latency_seconds() is None
    with pytest.raises(ValueError):
        hbm.latency_seconds(0)


def test_latency_and_memory_pages_use_one_dram_latency():
    from utils.gpu.simt import POINTER_CHASE_DRAM_LATENCY
    assert mh.level("H100-SXM", "HBM").latency_seconds() == POINTER_CHASE_DRAM_LATENCY["H100-PCIe"].seconds


def test_h100_l2_far_partition_is_slower_than_near_and_faster_than_dram():
    p = mh.PUBLISHED["H100-SXM"]
    assert p["l2_latency_cycles"].value < p["l2_far_latency_cycles"].value < p["hbm_latency_cycles"].value


def test_unknown_names_raise_and_list_the_allowed_ones():
    with pytest.raises(ValueError, match="H100-SXM"):
        mh.hierarchy("V100-SXM2")
    with pytest.raises(ValueError, match="HBM"):
        mh.level("H100-SXM", "L3 cache")
