import pytest
import torch
import torch.nn as nn

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.serving.quantisation.quant import dequantize, quantize
from utils.serving.quantisation.quant_model import (FakeQuantLinear, QuantLinear, fake_quant, fake_quantize_model,
                                       linear_weight_nbytes, paged_logits, quality, quantize_model)

CONFIG = LlamaConfig(vocab=32, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=64)


def _model(seed=0):
    torch.manual_seed(seed)
    return TinyLlama(CONFIG).eval()


@pytest.mark.parametrize("bits,group", [(8, 16), (4, 8), (4, None)])
def test_quant_linear_computes_with_the_dequantised_weight_within_half_a_step(bits, group):
    torch.manual_seed(1)
    linear = nn.Linear(32, 24, bias=False)
    layer = QuantLinear(linear, bits, group)
    x = torch.randn(5, 32)
    g = 32 if group is None else group
    q, s, z = quantize(linear.weight.detach(), bits, g)
    torch.testing.assert_close(layer(x), x @ dequantize(q, s, z, g, bits).T)
    # |x (W - W_hat)^T| <= |x| (s / 2)^T, the rounding bound of every weight
    half_step = (s / 2).repeat_interleave(g, dim=1)
    assert ((layer(x) - linear(x)).abs() <= x.abs() @ half_step.T * (1 + 1e-5) + 1e-6).all()


def test_quantize_model_replaces_the_blocks_linears_and_keeps_the_original():
    model = _model()
    before = [p.clone() for p in model.parameters()]
    q4 = quantize_model(model, 4, 16)
    assert isinstance(q4, TinyLlama)
    kinds = [type(m).__name__ for m in q4.modules() if isinstance(m, (nn.Linear, QuantLinear))]
    assert kinds.count("QuantLinear") == 7 * CONFIG.n_layers and kinds.count("Linear") == 1  # the head stays
    assert isinstance(quantize_model(model, 8, 16, include_head=True).out, QuantLinear)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_fewer_bits_and_wider_groups_lose_more():
    model = _model(2)
    tokens = torch.randint(0, 32, (4, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(tokens)
        err = {(b, g): (quantize_model(model, b, g)(tokens) - ref).pow(2).mean().item()
               for b, g in ((8, 16), (4, 8), (4, 32))}
    assert err[(8, 16)] < err[(4, 8)] < err[(4, 32)]


def test_weight_bytes_count_levels_scales_and_zeros():
    model = _model()
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    head = model.out.weight.numel()
    assert linear_weight_nbytes(model) == 4 * n
    body = n - head
    # int4: half a byte per weight; per 16-weight group a 4-byte (fp32) scale and a 1-byte zero point
    assert linear_weight_nbytes(quantize_model(model, 4, 16)) == body // 2 + body // 16 * 5 + 4 * head
    assert linear_weight_nbytes(quantize_model(model, 8, 16)) == body + body // 16 * 5 + 4 * head


def test_int8_fake_quant_is_an_exact_integer_product():
    torch.manual_seed(4)
    linear = nn.Linear(32, 16, bias=False).double()
    layer = FakeQuantLinear(linear, "int8")
    x = torch.randn(6, 32, dtype=torch.float64)
    w = linear.weight.detach()
    s_w, s_x = w.abs().amax(1) / 127, x.abs().amax(1) / 127
    q_w, q_x = torch.round(w / s_w[:, None]).long(), torch.round(x / s_x[:, None]).long()
    exact = (q_x @ q_w.T).double() * s_x[:, None] * s_w[None, :]  # what an int8 GEMM with fp32 rescale gives
    torch.testing.assert_close(layer(x), exact, rtol=1e-12, atol=1e-12)
    assert layer.nbytes == 16 * 32 + 4 * 16


def test_fp8_fake_quant_keeps_three_mantissa_bits():
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(5)) * 3
    y = fake_quant(x, "fp8_e4m3", None)
    scale = x.abs().max() / 448
    assert y.abs().max() == x.abs().max()
    assert ((y - x).abs() <= torch.maximum(x.abs() * 2**-4, scale * 2**-10) * (1 + 1e-6)).all()
    torch.testing.assert_close(fake_quant(y, "fp8_e4m3", None), y)  # already on the grid
    i8 = fake_quant(x, "int8", -1)
    steps = x.abs().amax(-1, keepdim=True) / 127
    assert ((i8 - x).abs() <= steps / 2 * (1 + 1e-6)).all()


def test_w8a8_model_is_close_and_fp8_differs_from_int8():
    model = _model(6)
    tokens = torch.randint(0, 32, (2, 10), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ref = model(tokens)
        a, b = fake_quantize_model(model, "int8")(tokens), fake_quantize_model(model, "fp8_e4m3")(tokens)
    assert (a - ref).abs().max() < 0.05 * ref.abs().max() and (b - ref).abs().max() < 0.1 * ref.abs().max()
    assert not torch.equal(a, b)


def test_bad_inputs_are_refused():
    model = _model()
    with pytest.raises(ValueError, match="bits"):
        quantize_model(model, 3, 16)
    with pytest.raises(ValueError, match="divide"):
        quantize_model(model, 4, 12)
    with pytest.raises(ValueError, match="fmt"):
        fake_quantize_model(model, "int4")
    with pytest.raises(ValueError, match="TinyLlama"):
        quantize_model(nn.Linear(4, 4), 8, 2)
    with pytest.raises(ValueError, match="bias-free"):
        QuantLinear(nn.Linear(4, 4), 8, 2)


def test_paged_logits_equal_the_model_forward_and_quality_measures():
    model = _model(8).double()
    tokens = torch.randint(0, 32, (3, 11), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        ref = model(tokens)
    torch.testing.assert_close(paged_logits(model, tokens, block_size=4), ref, atol=1e-12, rtol=0)
    targets = tokens.roll(-1, 1)
    same = quality(ref, ref, targets)
    assert same["kl"] == 0 and same["agreement"] == 1
    loss = torch.nn.functional.cross_entropy(ref.reshape(-1, 32), targets.reshape(-1)).item()
    assert same["loss"] == pytest.approx(loss)
    int8 = quality(paged_logits(model, tokens, "int8", block_size=4), ref, targets)
    fp8 = quality(paged_logits(model, tokens, "fp8_e4m3", block_size=4), ref, targets)
    assert 0 < int8["kl"] < fp8["kl"]  # per-vector int8 scales beat one unit FP8 scale on small keys
    with pytest.raises(ValueError, match="must match"):
        quality(ref[:, :-1], ref, targets)
