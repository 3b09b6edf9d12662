import pytest
import torch

from utils.parallel.mixed_precision.fp8_scaling import (ACTIVATION_TILE, WEIGHT_BLOCK, dequantize_blockwise, fake_quantize,
                                        quantization_error, quantize_blockwise)
from utils.parallel.mixed_precision.precision import FORMATS


def _x(rows=256, cols=512, seed=0):
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))


def test_deepseek_v3_tile_and_block_shapes():
    # arXiv:2412.19437, section 3.3: 1x128 activation tiles, 128x128 weight blocks
    assert ACTIVATION_TILE == (1, 128) and WEIGHT_BLOCK == (128, 128)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("block", [(256, 512), ACTIVATION_TILE, WEIGHT_BLOCK, (2, 64)])
def test_each_block_amax_lands_on_the_format_max(fmt, block):
    x = _x()
    q, scales = quantize_blockwise(x, block, fmt)
    assert q.dtype == FORMATS[fmt].dtype and q.shape == x.shape
    assert scales.shape == (x.shape[0] // block[0], x.shape[1] // block[1]) and scales.dtype == torch.float32
    blocks = q.float().reshape(scales.shape[0], block[0], scales.shape[1], block[1])
    assert torch.equal(blocks.abs().amax(dim=(1, 3)), torch.full_like(scales, FORMATS[fmt].max))


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_round_trip_of_normal_numbers_is_within_half_an_ulp(fmt):
    x = _x()
    r = fake_quantize(x, ACTIVATION_TILE, fmt)
    f = FORMATS[fmt]
    q, scales = quantize_blockwise(x, ACTIVATION_TILE, fmt)
    normal = q.float().abs() >= f.smallest_normal  # elements that stayed in the normal range after scaling
    rel = ((r - x).abs() / x.abs())[normal]
    assert rel.max() <= f.eps / 2 * (1 + 1e-6)
    torch.testing.assert_close(dequantize_blockwise(q, scales, ACTIVATION_TILE), r, rtol=0, atol=0)


def test_per_tensor_equals_a_single_block():
    x = _x()
    q, s = quantize_blockwise(x, tuple(x.shape))
    assert s.shape == (1, 1)
    assert s.item() == pytest.approx(FORMATS["fp8_e4m3"].max / x.abs().max().item())
    ref = (x * s.item()).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(q.view(torch.uint8), ref.view(torch.uint8))


def test_outlier_channels_ruin_per_tensor_scaling_but_not_tiles():
    # two channels 10^4 times larger than the rest, as outlier features of LLM activations are; both in the
    # first 128-channel tile, so seven tiles of eight in every row are free of them
    x = _x(cols=1024, seed=1)
    x[:, [7, 100]] *= 1e4
    per_tensor = quantization_error(x, tuple(x.shape))
    tiles = quantization_error(x, ACTIVATION_TILE)
    assert per_tensor["zeroed"] > 5 * tiles["zeroed"]
    assert per_tensor["median relative error"] > 1.5 * tiles["median relative error"]
    # without outliers the two agree: the scale only matters when the range is wide
    plain = _x(seed=1)
    a, b = quantization_error(plain, tuple(plain.shape)), quantization_error(plain, ACTIVATION_TILE)
    assert a["median relative error"] == pytest.approx(b["median relative error"], rel=0.1)


def test_zero_block_and_saturation():
    x = torch.zeros(2, 128)
    x[1, 3] = 1e6  # far beyond E4M3's 448: the scale brings it to 448, never NaN
    q, s = quantize_blockwise(x, ACTIVATION_TILE)
    assert s[0, 0] == 1.0 and torch.all(q[0].float() == 0)
    assert q[1, 3].float() == 448 and not torch.isnan(q.float()).any()
    assert fake_quantize(x, ACTIVATION_TILE)[1, 3] == pytest.approx(1e6)


@pytest.mark.parametrize("bad", [
    dict(x=torch.randn(4, 100), block=(1, 128)),
    dict(x=torch.randn(4, 128), block=(1, 128), fmt="fp16"),
    dict(x=torch.randn(4, 128, 1), block=(1, 128)),
    dict(x=torch.full((1, 128), float("inf")), block=(1, 128)),
    dict(x=torch.randn(4, 128), block=(0, 128)),
    dict(x=torch.randn(4, 128), block=[1, 128]),
])
def test_bad_input_raises(bad):
    with pytest.raises(ValueError):
        quantize_blockwise(**bad)


def test_dequantize_checks_its_arguments():
    q, s = quantize_blockwise(_x(), ACTIVATION_TILE)
    with pytest.raises(ValueError):
        dequantize_blockwise(q.float(), s, ACTIVATION_TILE)
    with pytest.raises(ValueError):
        dequantize_blockwise(q, s[:, :1], ACTIVATION_TILE)
    with pytest.raises(ValueError):
        quantization_error(torch.zeros(1, 128), ACTIVATION_TILE)
