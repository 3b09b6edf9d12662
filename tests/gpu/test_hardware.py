import pytest
from hypothesis import given
from hypothesis import strategies as st

from utils.gpu import hardware
from utils.gpu.hardware import attainable_flops, occupancy, occupancy_report, spec


def test_h100_sxm_matches_its_datasheet():
    h100 = spec("H100-SXM")
    assert h100.hbm_bandwidth == pytest.approx(3.35e12)  # 3.35 TB/s (H100 datasheet)
    assert round(h100.peak_flops["bf16"] / 1e12) == 989  # 989 dense bf16 TFLOP/s (whitepaper)
    assert h100.sm_count == 132
    assert h100.nvlink_bandwidth == pytest.approx(900e9)
    assert h100.l2_bytes == 50 * 2**20


@pytest.mark.parametrize("name, bandwidth, bf16_tflops, sms", [
    ("A100-SXM4-80GB", 2.039e12, 312, 108),
    ("H200", 4.8e12, 989, 132),
    ("B200", 8e12, 2250, 148),
])
def test_other_chips_match_their_datasheets(name, bandwidth, bf16_tflops, sms):
    g = spec(name)
    assert g.hbm_bandwidth == pytest.approx(bandwidth)
    assert round(g.flops("bf16") / 1e12) == bf16_tflops
    assert g.sm_count == sms


def test_b200_sizes_are_the_device_reported_ones():
    # cudaGetDeviceProperties on a B200: multiProcessorCount 148, l2CacheSize 129,536 KiB (126.5 MiB).
    b200 = spec("B200")
    assert b200.sm_count == 148
    assert b200.l2_bytes == 129536 * 1024


def test_every_spec_has_every_required_field_and_a_source():
    for name in ("A100-SXM4-80GB", "H100-SXM", "H200", "B200"):
        g = spec(name)
        assert set(g.peak_flops) <= set(hardware.PRECISIONS)
        assert {"fp32", "tf32", "fp16", "bf16"} <= set(g.peak_flops)
        assert g.sources
        for attr in ("hbm_bandwidth", "sm_count", "l2_bytes", "smem_per_sm_bytes", "registers_per_sm",
                     "max_warps_per_sm", "max_blocks_per_sm", "nvlink_bandwidth"):
            assert getattr(g, attr) > 0


def test_fp8_exists_only_from_hopper_on():
    assert spec("H100-SXM").flops("fp8") == pytest.approx(2 * spec("H100-SXM").flops("bf16"), rel=1e-3)
    with pytest.raises(ValueError, match="no fp8"):
        spec("A100-SXM4-80GB").flops("fp8")


def test_unknown_names_list_the_allowed_ones():
    with pytest.raises(ValueError, match="H100-SXM"):
        spec("H100")
    with pytest.raises(ValueError, match="fp32"):
        spec("H100-SXM").flops("int4")


def test_roofline():
    h100 = spec("H100-SXM")
    assert attainable_flops(1.0, h100.flops("bf16"), h100.hbm_bandwidth) == pytest.approx(3.35e12)
    assert attainable_flops(1e4, h100.flops("bf16"), h100.hbm_bandwidth) == h100.flops("bf16")
    ridge = h100.flops("bf16") / h100.hbm_bandwidth  # utils.gpu.roofline.ridge_point; tested there
    assert attainable_flops(ridge, h100.flops("bf16"), h100.hbm_bandwidth) == pytest.approx(h100.flops("bf16"))


@given(st.floats(0, 1e6), st.floats(0, 1e6))
def test_roofline_is_monotone_and_capped(i1, i2):
    lo, hi = sorted((i1, i2))
    assert attainable_flops(lo, 1e15, 3e12) <= attainable_flops(hi, 1e15, 3e12) <= 1e15


@pytest.mark.parametrize("threads, expected", [(128, 0.75), (320, 0.625)])
def test_occupancy_matches_the_cuda_best_practices_guide(threads, expected):
    # CUDA C++ Best Practices Guide, "Calculating Occupancy": on compute capability 7.0, 37 registers per
    # thread give 75% occupancy with 128-thread blocks (12 blocks) but 63% with 320-thread blocks (4 blocks).
    assert occupancy(threads, 37, 0, gpu="V100-SXM2") == pytest.approx(expected)
    assert occupancy_report(threads, 37, 0, gpu="V100-SXM2").limiter == "registers"


def test_occupancy_limits():
    assert occupancy(256, 32, 0) == 1.0  # 8 blocks of 8 warps fill 64 warps
    assert occupancy(32, 16, 0) == 0.5  # 32 one-warp blocks: the block limit binds
    assert occupancy_report(32, 16, 0).limiter == "blocks"
    report = occupancy_report(256, 32, 100 * 1024)  # two blocks of ~101 KB fit in 228 KB
    assert (report.active_blocks, report.limiter) == (2, "shared memory")
    assert occupancy(1024, 255, 0) == 0.0  # 255 regs x 1024 threads exceed the register file


@pytest.mark.parametrize("args", [(0, 32, 0), (2048, 32, 0), (128, 0, 0), (128, 256, 0),
                                  (128, 32, 300 * 1024), (128, 32, -1), (128.0, 32, 0)])
def test_impossible_launches_raise(args):
    with pytest.raises(ValueError):
        occupancy(*args)


def test_littles_law():
    # Arithmetic of the law: 3.35 TB/s times an assumed (loaded) latency of 600 ns is 2.01 MB in flight.
    assert hardware.bytes_in_flight(3.35e12, 600e-9) == pytest.approx(2.01e6)


@pytest.mark.parametrize("device_name, expected", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"), ("NVIDIA H200", "H200"), ("NVIDIA B200", "B200"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"), ("Tesla V100-SXM2-32GB", "V100-SXM2"),
    ("NVIDIA H100 PCIe", None), ("NVIDIA A100-PCIE-40GB", None), ("NVIDIA GeForce RTX 4090", None),
])
def test_spec_for_device_name(device_name, expected):
    found = hardware.spec_for_device(device_name)
    assert (found.name if found else None) == expected
