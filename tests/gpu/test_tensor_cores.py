import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from utils.gpu import hardware
from utils.gpu import tensor_cores as tc
from utils.gpu.memory_hierarchy import sm_clock_hz
from utils.kernels.matmul import tile_intensity


@pytest.mark.parametrize("gpu", ["V100-SXM2", "A100-SXM4-80GB", "H100-SXM"])
def test_peak_rebuilt_from_per_sm_rates_matches_the_vendor_peak(gpu):
    # V100 125, A100 312, H100 SXM 989.4 dense fp16 TFLOP/s (hardware.GPUS, from the whitepapers).
    assert tc.tensor_core_peak_flops(gpu) == pytest.approx(hardware.spec(gpu).flops("fp16"), rel=0.005)


def test_h100_per_sm_rate_and_clock():
    r = tc.TENSOR_CORE_RATES["H100-SXM"]
    per_sm_flops_per_clock = r.tensor_cores_per_sm.value * 2 * r.fma_per_clock_per_tensor_core.value
    assert per_sm_flops_per_clock == 4096  # twice the A100 SM's 2048
    a100 = tc.TENSOR_CORE_RATES["A100-SXM4-80GB"]
    assert a100.tensor_cores_per_sm.value * a100.fma_per_clock_per_tensor_core.value == 1024
    # The FP32 peak's clock (1.98 GHz) would overshoot the Tensor Core peak by 8 %.
    at_fp32_clock = 132 * per_sm_flops_per_clock * sm_clock_hz("H100-SXM")
    assert at_fp32_clock / 989.4e12 == pytest.approx(1.082, abs=0.001)
    assert 989.4e12 / (132 * 4096) == pytest.approx(1.83e9, rel=0.001)


def test_instruction_shapes():
    wg = tc.MMA_INSTRUCTIONS["wgmma.mma_async.m64n256k16 (fp16)"]
    assert (wg.m, wg.n, wg.k, wg.threads) == (64, 256, 16, 128)
    assert wg.flops == 524_288
    mma = tc.MMA_INSTRUCTIONS["mma.sync.m16n8k16 (fp16)"]
    assert (mma.m, mma.n, mma.k, mma.threads, mma.flops) == (16, 8, 16, 32, 4096)


def test_mma_instruction_count():
    # 4096^3 in m64n256k16: 64 * 16 * 256 instructions, whose FLOPs add up to the GEMM's.
    count = tc.mma_instructions(4096, 4096, 4096, "wgmma.mma_async.m64n256k16 (fp16)")
    assert count == 64 * 16 * 256 == 262_144
    assert count * 2 * 64 * 256 * 16 == 2 * 4096**3
    assert tc.mma_instructions(17, 8, 16, "mma.sync.m16n8k16 (fp16)") == 2
    with pytest.raises(ValueError):
        tc.mma_instructions(16, 8, 16, "hmma")


def test_tile_quantization_hand_cases():
    assert tc.tile_quantization_efficiency(4096, 4096, 128, 256) == 1.0
    # 257 columns in 128-wide tiles: 3 tiles, 257/384 of their work is useful.
    assert tc.tile_quantization_efficiency(128, 257, 128, 128) == pytest.approx(257 / 384)
    assert tc.n_tiles(1792, 1792, 256, 128) == 7 * 14 == 98


def test_wave_quantization_hand_cases():
    assert tc.waves(132, 132) == 1 and tc.wave_quantization_efficiency(132, 132) == 1.0
    assert tc.waves(133, 132) == 2
    assert tc.wave_quantization_efficiency(133, 132) == pytest.approx(133 / 264)
    # 4096^3 in 128 x 256 tiles: 512 tiles = 3.88 waves -> 4 waves.
    assert tc.wave_quantization_efficiency(512, 132) == pytest.approx(512 / 528)
    # Two tiles per SM: a wave is 264 tiles.
    assert tc.wave_quantization_efficiency(265, 132, tiles_per_sm=2) == pytest.approx(265 / 528)
    # 98 tiles on an A100's 108 SMs (1792^2 output in 256 x 128 tiles): one wave, 10 SMs idle.
    assert tc.wave_quantization_efficiency(98, 108) == pytest.approx(98 / 108)


@given(tiles=st.integers(1, 10_000), sms=st.integers(1, 200), per_sm=st.integers(1, 4))
def test_wave_efficiency_against_a_simulation(tiles, sms, per_sm):
    # Independent computation: hand tiles to slots one wave at a time and count idle slot-waves.
    slots, left, busy, total = sms * per_sm, tiles, 0, 0
    while left > 0:
        running = min(slots, left)
        busy, total, left = busy + running, total + slots, left - running
    assert tc.wave_quantization_efficiency(tiles, sms, per_sm) == pytest.approx(busy / total)
    assert 0 < busy / total <= 1


@given(bm=st.sampled_from([64, 128, 256]), bn=st.sampled_from([64, 128, 256]), s=st.sampled_from([1, 2, 4]))
def test_cluster_of_one_is_tile_intensity(bm, bn, s):
    assert tc.cluster_tile_intensity(bm, bn, s) == pytest.approx(tile_intensity(bm, bn, 64, s))


def test_cluster_intensity_hand_cases():
    assert tc.cluster_tile_intensity(128, 128, 2) == 64.0
    assert tc.cluster_tile_intensity(128, 256, 2) == pytest.approx(256 / 3)
    # Two CTAs stacked along M share the B block: 2*128*256 / ((128 + 128) * 2) = 128.
    assert tc.cluster_tile_intensity(128, 256, 2, cluster_m=2) == 128.0
    assert tc.cluster_tile_intensity(128, 128, 2, cluster_m=2, cluster_n=2) == 128.0


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_bad_input_raises(bad):
    with pytest.raises(ValueError):
        tc.wave_quantization_efficiency(bad, 132)
    with pytest.raises(ValueError):
        tc.tile_quantization_efficiency(128, bad, 128, 128)
    with pytest.raises(ValueError):
        tc.cluster_tile_intensity(128, 128, 2, cluster_m=bad)
    with pytest.raises(ValueError):
        tc.tensor_core_peak_flops("H100")


def test_the_matmul_guides_wave_example_on_an_a100():
    """NVIDIA, Matrix Multiplication Background User's Guide (DU-09799-001), section 3.2 "Wave Quantization":
    an A100 has 108 SMs; with 256 x 128 tiles, one thread block per SM, a wave holds 108 tiles (M = 2304,
    K = 4096, N varied). Figures as quoted second-hand (the guide's figures are images)."""
    from utils.gpu.tensor_cores import n_tiles, wave_quantization_efficiency, waves

    assert n_tiles(2304, 1536, 256, 128) == 108 and waves(108, 108) == 1
    assert wave_quantization_efficiency(108, 108) == 1.0
    assert n_tiles(2304, 1664, 256, 128) == 117 and waves(117, 108) == 2  # one more column of tiles: a second wave
    assert wave_quantization_efficiency(117, 108) == pytest.approx(117 / 216)
