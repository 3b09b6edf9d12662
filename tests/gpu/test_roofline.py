import pytest
from hypothesis import given
from hypothesis import strategies as st

from utils.gpu import hardware
from utils.gpu import roofline as rl

CHIPS = ("A100-SXM4-80GB", "H100-SXM", "H200", "B200")


def test_nvidia_performance_guide_table_1():
    # NVIDIA "GPU Performance Background User's Guide", Table 1 (fp16, V100):
    # linear layer 4096 outputs, 1024 inputs: batch 512 -> 315 FLOPS/B, batch 1 -> 1 FLOPS/B; ReLU -> 0.25 FLOPS/B.
    assert round(rl.matmul_intensity(512, 4096, 1024, 2)) == 315
    assert round(rl.matmul_intensity(1, 4096, 1024, 2)) == 1
    assert rl.elementwise_intensity(1, 2) == 0.25
    # ... and V100's ops:byte ratio, 125 TFLOPS / 900 GB/s = 138.9.
    assert round(rl.ridge_point("V100-SXM2", "fp16"), 1) == 138.9


def test_h100_ridge_point():
    assert rl.ridge_point("H100-SXM", "bf16") == pytest.approx(989.4e12 / 3.35e12)
    assert round(rl.ridge_point("H100-SXM")) == 295
    h100 = hardware.spec("H100-SXM")
    assert rl.ridge_point("H100-SXM", "fp16") == pytest.approx(h100.flops("fp16") / h100.hbm_bandwidth)


@given(n=st.integers(1, 1 << 16), b=st.sampled_from([1, 2, 4]))
def test_square_matmul_intensity_is_2n_over_3b(n, b):
    assert rl.matmul_intensity(n, n, n, b) == pytest.approx(2 * n / (3 * b))


def test_elementwise_and_softmax_intensities():
    assert rl.elementwise_intensity(1, 4) == 1 / 8  # ReLU, fp32
    assert rl.elementwise_intensity(1, 4, n_inputs=2) == 1 / 12  # vector add, fp32
    assert rl.softmax_intensity(4) == 5 / 8
    assert rl.softmax_cost(3, 7, 2).flops == 5 * 21 and rl.softmax_cost(3, 7, 2).nbytes == 2 * 21 * 2
    assert rl.reduction_intensity(1, 1_000_001, 4) == pytest.approx(0.25, rel=1e-5)
    assert rl.reduction_cost(2, 3, 4).flops == 4 and rl.reduction_cost(2, 3, 4).nbytes == (6 + 2) * 4


def test_attention_counts_match_algorithm_0_of_flashattention():
    s, d, b = 1024, 64, 2
    naive = rl.attention_cost(s, d, b, fused=False)
    assert naive.flops == 4 * s * s * d
    assert naive.nbytes == (4 * s * d + 4 * s * s) * b
    assert naive.intensity == pytest.approx(s * d / ((s + d) * b))
    fused = rl.attention_cost(s, d, b, fused=True)
    assert fused.nbytes == 4 * s * d * b and fused.intensity == pytest.approx(s / b)
    # K and V re-read once per block of 128 query rows: 8 passes.
    blocked = rl.attention_cost(s, d, b, fused=True, block_rows=128)
    assert blocked.nbytes == (2 * s * d + 2 * s * d * 8) * b
    # ... unless the re-reads hit L2: HBM then sees K and V once, whatever the tile
    assert rl.attention_cost(s, d, b, fused=True, block_rows=128, kv_reuse="l2").nbytes == fused.nbytes
    # 4 S^2 d FLOPs over (2 + 2 T_r) S d b bytes: just under 2 B_r / b = 64 for 64-row tiles in fp16
    assert rl.attention_intensity(s, d, b, fused=True, block_rows=64) == pytest.approx(4 * s / ((2 + 2 * 16) * b))


def test_materialising_scores_makes_attention_memory_bound():
    for gpu in CHIPS:
        assert rl.bound(rl.attention_intensity(4096, 128, 2, fused=False), gpu) == "memory"
        assert rl.bound(rl.attention_intensity(4096, 128, 2, fused=True), gpu) == "compute"
    # The two matmuls of standard attention have the same intensity, 2 S d / ((S + 2d) b), below its limit 2d/b.
    s, d = 4096, 128
    qk = rl.matmul_intensity(s, s, d, 2)
    pv = rl.matmul_intensity(s, d, s, 2)
    assert qk == pytest.approx(pv) == pytest.approx(2 * s * d / ((s + 2 * d) * 2))
    assert qk < 2 * d / 2


def test_big_matmul_is_compute_bound_and_relu_memory_bound_everywhere():
    assert rl.bound(rl.matmul_intensity(4096, 4096, 4096, 2), "H100-SXM") == "compute"
    for gpu in CHIPS:
        p = rl.place(rl.elementwise_intensity(1, 2), gpu)
        assert p.bound == "memory"
        assert p.attainable_flops == pytest.approx(0.25 * hardware.spec(gpu).hbm_bandwidth)
        assert p.fraction_of_peak < 0.01


def test_place_at_and_around_the_ridge():
    ridge = rl.ridge_point("H100-SXM")
    assert rl.place(ridge).bound == "compute"
    assert rl.place(ridge).attainable_flops == pytest.approx(989.4e12)
    below = rl.place(ridge / 2)
    assert below.bound == "memory" and below.fraction_of_peak == pytest.approx(0.5)


def test_min_seconds():
    cost = rl.matmul_cost(8192, 8192, 8192, 2)
    assert rl.min_seconds(cost, "H100-SXM") == pytest.approx(2 * 8192**3 / 989.4e12)
    relu = rl.elementwise_cost(2**30, 1, 2)
    assert rl.min_seconds(relu, "H100-SXM") == pytest.approx(2 * 2**30 * 2 / 3.35e12)


@given(i1=st.floats(1e-3, 1e5), i2=st.floats(1e-3, 1e5), gpu=st.sampled_from(CHIPS))
def test_attainable_is_monotone_and_capped(i1, i2, gpu):
    lo, hi = sorted((i1, i2))
    a, b = rl.place(lo, gpu), rl.place(hi, gpu)
    assert a.attainable_flops <= b.attainable_flops <= b.peak_flops
    assert (lo < a.ridge_point) == (a.bound == "memory")


@given(s=st.integers(1, 1 << 15), d=st.sampled_from([32, 64, 128, 256]))
def test_fused_attention_never_moves_more_bytes(s, d):
    assert rl.attention_cost(s, d, 2, True).nbytes <= rl.attention_cost(s, d, 2, False).nbytes


@pytest.mark.parametrize("call", [
    lambda: rl.matmul_intensity(0, 4, 4, 2),
    lambda: rl.matmul_intensity(4, 4, 4, 0),
    lambda: rl.matmul_intensity(4.0, 4, 4, 2),
    lambda: rl.elementwise_intensity(-1, 4),
    lambda: rl.elementwise_intensity(1, 4, n_inputs=-1),
    lambda: rl.attention_intensity(128, 64, 2, fused="yes"),
    lambda: rl.attention_intensity(128, 64, 2, fused=False, block_rows=64),
    lambda: rl.attention_intensity(128, 64, 2, fused=True, block_rows=0),
    lambda: rl.attention_intensity(128, 64, 2, fused=True, kv_reuse="smem"),
    lambda: rl.attention_intensity(128, 64, 2, fused=False, kv_reuse="l2"),
    lambda: rl.place(0.0),
    lambda: rl.place(1.0, "H100"),
    lambda: rl.place(1.0, "A100-SXM4-80GB", "fp8"),
    lambda: rl.min_seconds(1.0),
])
def test_bad_inputs_raise(call):
    with pytest.raises(ValueError):
        call()


def test_exponentials_take_half_the_matmul_time_at_d128_flashattention3():
    """FlashAttention-3, section 3.1: 989 TFLOPS of matmul, 3.9 TFLOPS of special functions, d = 128: 50%."""
    ratio = rl.attention_exp_time_ratio(128, 989e12, 3.9e12)
    assert ratio == pytest.approx(0.495, abs=0.001)
    assert rl.attention_serial_exp_bound(128, 989e12, 3.9e12) == pytest.approx(989e12 / 1.495, rel=1e-3)
    assert rl.attention_exp_time_ratio(64, 989e12, 3.9e12) == pytest.approx(2 * ratio)  # smaller heads: worse
    with pytest.raises(ValueError):
        rl.attention_exp_time_ratio(0, 989e12, 3.9e12)
    with pytest.raises(ValueError):
        rl.attention_serial_exp_bound(128, 989e12, -1.0)


def test_a_partial_row_tile_still_reads_k_and_v():
    # S = 1000 in tiles of 128 rows: 7 full tiles and one of 104 rows, so K and V are read ceil(1000/128) = 8
    # times: (2 + 2 * 8) S d b = 18 * 1000 * 64 * 2 bytes. A sequence shorter than one tile reads them once.
    assert rl.attention_cost(1000, 64, 2, fused=True, block_rows=128).nbytes == 18 * 1000 * 64 * 2
    assert rl.attention_cost(100, 64, 2, fused=True, block_rows=128).nbytes == 4 * 100 * 64 * 2
