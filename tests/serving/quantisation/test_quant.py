"""utils.serving.quantisation.quant: group-wise weight quantisation and the quantised KV cache, against their error bounds."""

import pytest
import torch
from hypothesis import given, strategies as st

from utils.serving.quantisation.quant import (FP8_E4M3_MAX, bytes_per_weight, dequantize, dequantize_kv, fake_quantize,
                                 kv_bytes_per_element, quantize, quantize_kv, unpack_int4)


def _weight(out_features=6, in_features=64, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=g) * (0.1 + 3 * torch.rand(out_features, 1, generator=g))
    return w.to(dtype)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [8, 32, 64])
def test_round_trip_error_is_at_most_half_a_scale_per_group(bits, group_size):
    w = _weight()
    q, scales, zeros = quantize(w, bits, group_size)
    err = (w - dequantize(q, scales, zeros, group_size, bits)).abs()
    bound = scales.repeat_interleave(group_size, dim=1) / 2
    assert (err <= bound * (1 + 1e-6) + 1e-7).all()
    assert (err / bound).max() > 0.8  # round to nearest: the bound is nearly reached somewhere, not far below it


@given(st.integers(0, 10_000), st.sampled_from([4, 8]), st.sampled_from([2, 4, 16]))
def test_error_bound_holds_for_any_weights(seed, bits, group_size):
    w = _weight(3, 32, seed) + (seed % 7 - 3)  # shifted: groups entirely above or below zero too
    q, scales, zeros = quantize(w, bits, group_size)
    err = (w - dequantize(q, scales, zeros, group_size, bits)).abs()
    assert (err <= scales.repeat_interleave(group_size, dim=1) / 2 * (1 + 1e-5) + 1e-6).all()
    assert int(zeros.max()) <= 2**bits - 1


def test_fp16_weights_keep_the_bound_with_the_stored_fp16_scale():
    w = _weight(dtype=torch.float16)
    q, scales, zeros = quantize(w, 4, 32)
    assert scales.dtype == torch.float16 and zeros.dtype == torch.uint8
    err = (w.float() - dequantize(q, scales, zeros, 32, 4).float()).abs()
    assert (err <= scales.float().repeat_interleave(32, dim=1) / 2 * 1.01 + 1e-3).all()


@pytest.mark.parametrize("bits", [4, 8])
def test_scales_zeros_and_layout_follow_the_documented_formulas(bits):
    w, group_size, maxq = _weight(), 16, 2**bits - 1
    q, scales, zeros = quantize(w, bits, group_size)
    for row in range(w.shape[0]):
        for g in range(w.shape[1] // group_size):
            block = w[row, g * group_size:(g + 1) * group_size]
            lo, hi = min(block.min().item(), 0.0), max(block.max().item(), 0.0)
            assert scales[row, g].item() == pytest.approx((hi - lo) / maxq, rel=1e-6)
            assert zeros[row, g].item() == round(-lo / scales[row, g].item())
    levels = torch.clamp(torch.round(w / scales.repeat_interleave(group_size, 1))
                         + zeros.repeat_interleave(group_size, 1).float(), 0, maxq).to(torch.uint8)
    if bits == 8:
        assert q.shape == w.shape and torch.equal(q, levels)
    else:  # byte j = column 2j in the low nibble, column 2j + 1 in the high nibble
        assert q.shape == (w.shape[0], w.shape[1] // 2)
        assert torch.equal(q.int(), levels[:, 0::2].int() + 16 * levels[:, 1::2].int())
        assert torch.equal(unpack_int4(q), levels)


def test_zero_and_constant_groups_are_exact():
    w = torch.zeros(2, 8)
    w[1, 4:] = -2.5  # a constant group: its value is an end of the range [min(w, 0), max(w, 0)]
    q, scales, zeros = quantize(w, 4, 4)
    assert torch.equal(dequantize(q, scales, zeros, 4, 4), w)


def test_bytes_per_weight_matches_what_quantize_stores():
    w = _weight(8, 256, dtype=torch.float16)
    for bits, group_size in ((4, 128), (4, 32), (8, 64)):
        q, scales, zeros = quantize(w, bits, group_size)
        stored = sum(t.numel() * t.element_size() for t in (q, scales, zeros))
        assert bytes_per_weight(bits, group_size) == pytest.approx(stored / w.numel())
    assert bytes_per_weight(4, 128) == pytest.approx(0.5 + 3 / 128)
    assert bytes_per_weight(8, 64, scale_bytes=4, zero_bytes=0) == pytest.approx(1 + 4 / 64)


@pytest.mark.parametrize("bad", [dict(bits=3), dict(bits=16), dict(group_size=0), dict(group_size=5),
                                 dict(group_size=48), dict(group_size=True)])
def test_bad_bits_or_group_size_are_refused(bad):
    args = dict(bits=4, group_size=16) | bad
    with pytest.raises(ValueError, match="bits must|group_size"):
        quantize(_weight(), **args)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="2-D floating-point"):
        quantize(torch.ones(8), 4, 4)
    with pytest.raises(ValueError, match="2-D floating-point"):
        quantize(torch.ones(2, 8, dtype=torch.int32), 4, 4)
    q, scales, zeros = quantize(_weight(), 4, 16)
    with pytest.raises(ValueError, match="scales and zeros must both be"):
        dequantize(q, scales[:, :-1], zeros[:, :-1], 16, 4)
    with pytest.raises(ValueError, match="uint8"):
        dequantize(q.int(), scales, zeros, 16, 4)


def test_int8_kv_cache_has_a_scale_per_vector_and_half_a_step_of_error():
    g = torch.Generator().manual_seed(1)
    k = torch.randn(5, 3, 2, 16, generator=g) * torch.rand(5, 3, 2, 1, generator=g) * 4
    data, scale = quantize_kv(k, "int8")
    assert data.dtype == torch.int8 and scale.shape == (5, 3, 2)
    assert torch.allclose(scale, k.abs().amax(-1) / 127)
    err = (k - dequantize_kv(data, scale)).abs()
    assert (err <= scale[..., None] / 2 * (1 + 1e-6)).all()
    assert kv_bytes_per_element("int8", 16) == pytest.approx((data.numel() + 4 * scale.numel()) / k.numel())


def test_fp8_kv_cache_has_one_scale_and_e4m3_precision():
    g = torch.Generator().manual_seed(2)
    v = torch.randn(7, 2, 8, generator=g) * 10
    data, scale = quantize_kv(v, "fp8_e4m3")
    assert data.dtype == torch.float8_e4m3fn and scale.dim() == 0
    assert data.float().abs().max().item() == FP8_E4M3_MAX == torch.finfo(torch.float8_e4m3fn).max
    err = (v - dequantize_kv(data, scale, torch.float32)).abs()
    assert (err <= torch.maximum(v.abs() * 2**-4, scale * 2**-10) * (1 + 1e-6)).all()
    assert kv_bytes_per_element("fp8_e4m3", 8) == 1.0


def test_kv_refusals():
    with pytest.raises(ValueError, match="fmt must be one of"):
        quantize_kv(torch.ones(2, 4), "int4")
    with pytest.raises(ValueError, match="one scale per vector"):
        dequantize_kv(torch.zeros(2, 4, dtype=torch.int8), torch.ones(4))
    with pytest.raises(ValueError, match="one scale per tensor"):
        dequantize_kv(torch.zeros(2, 4).to(torch.float8_e4m3fn), torch.ones(2))
    with pytest.raises(ValueError, match="int8 or float8"):
        dequantize_kv(torch.zeros(2, 4), torch.ones(2))


def test_fake_quantize_is_the_round_trip_and_idempotent():
    w = _weight(dtype=torch.float16)
    once = fake_quantize(w, 4, 16)
    assert once.dtype == w.dtype and once.shape == w.shape
    assert torch.equal(once, dequantize(*quantize(w, 4, 16), 16, 4))
    assert (once.float() - w.float()).abs().max() > 0
    on_grid = fake_quantize(w.float(), 4, 16)  # both ends of each range are levels: requantising keeps the grid
    torch.testing.assert_close(fake_quantize(on_grid, 4, 16), on_grid, rtol=1e-5, atol=1e-6)


def test_fp8_kv_cache_with_a_fixed_scale_saturates_beyond_its_range():
    x = torch.tensor([[[0.5, -3.0, 1000.0, -2000.0]]])
    data, scale = quantize_kv(x, "fp8_e4m3", scale=2.0)
    assert float(scale) == 2.0
    back = dequantize_kv(data, scale)
    assert back[0, 0, 2] == back[0, 0, 3].neg() == 448 * 2  # clamped to +-448 steps of the scale
    assert back[0, 0, 0] == 0.5 and back[0, 0, 1] == -3.0     # exactly representable after division by 2
    with pytest.raises(ValueError, match="FP8 cache only"):
        quantize_kv(x, "int8", scale=1.0)
    with pytest.raises(ValueError, match="positive finite"):
        quantize_kv(x, "fp8_e4m3", scale=0.0)
