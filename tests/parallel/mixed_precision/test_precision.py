"""Formats against torch.finfo, the stored bits and the published figures; the loss scaler against GradScaler."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
import torch

from utils.parallel import memory
from utils.parallel.mixed_precision.loss_scaling import DynamicLossScaler, make_mlp, make_task
from utils.parallel.mixed_precision.precision import (FORMATS, PUBLISHED, decode_bits, float_bits, get_format,
                                      model_state_bytes_per_param)

matplotlib.use("Agg")

WITH_DTYPE = [name for name, f in FORMATS.items() if f.torch_dtype]
_INT = {32: torch.int32, 16: torch.int16, 8: torch.uint8}


@pytest.mark.parametrize("name", WITH_DTYPE)
def test_formats_match_torch_finfo(name):
    f = FORMATS[name]
    info = torch.finfo(f.dtype)
    assert f.bits == info.bits
    assert f.eps == info.eps
    assert f.max == info.max
    assert f.smallest_normal == info.smallest_normal


@pytest.mark.parametrize("name", WITH_DTYPE)
def test_smallest_subnormal_is_bit_pattern_one_and_half_of_it_rounds_to_zero(name):
    f = FORMATS[name]
    one = torch.tensor([1], dtype=_INT[f.bits]).view(f.dtype)
    assert one.float().item() == f.smallest_subnormal
    assert torch.tensor([f.smallest_subnormal / 2]).to(f.dtype).float().item() == 0.0  # ties to even: 0
    assert torch.tensor([f.smallest_subnormal * 0.75]).to(f.dtype).float().item() == f.smallest_subnormal


@pytest.mark.parametrize("key", list(PUBLISHED), ids=["-".join(k) for k in PUBLISHED])
def test_formats_match_published_figures(key):
    name, prop = key
    assert getattr(FORMATS[name], prop) == PUBLISHED[key].value


def test_fp8_special_values():
    assert not FORMATS["fp8_e4m3"].has_inf and FORMATS["fp8_e5m2"].has_inf
    assert math.isnan(decode_bits(0, "1111", "111", "fp8_e4m3"))  # E4M3's only NaN pattern
    assert decode_bits(0, "1111", "110", "fp8_e4m3") == 448.0
    assert decode_bits(0, "11111", "00", "fp8_e5m2") == math.inf
    assert decode_bits(1, "11110", "11", "fp8_e5m2") == -57344.0


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("value", [1.0, -3.14159, 1e-5, 0.1, 300.0, -2.0 ** -20])
def test_float_bits_round_trip_to_torch_cast(name, value):
    bits = float_bits(value, name)
    f = FORMATS[name]
    assert len(bits.exponent) == f.exponent_bits and len(bits.mantissa) == f.mantissa_bits
    if f.dtype is not None:
        expected = torch.tensor([value]).to(f.dtype).float().item()
    else:  # tf32: fp32 rounded to 10 mantissa bits, within half an ulp of 2^-10
        expected = value
        assert abs(bits.value - value) <= abs(value) * f.eps / 2
    if f.dtype is not None:
        assert bits.value == expected
    assert decode_bits(bits.sign, bits.exponent, bits.mantissa, name) == bits.value


def test_tf32_rounds_to_nearest_even():
    # 10 mantissa bits: 1 + 2^-11 is exactly half way between 1 and 1 + 2^-10, and ties go to the even (1.0)
    assert float_bits(1 + 2.0 ** -11, "tf32").value == 1.0
    assert float_bits(1 + 2.0 ** -11 + 2.0 ** -12, "tf32").value == 1 + 2.0 ** -10
    assert float_bits(1 + 3 * 2.0 ** -11, "tf32").value == 1 + 2.0 ** -9  # tie from the odd side rounds up
    assert float_bits(1 + 2.0 ** -11, "fp16").value == float_bits(1 + 2.0 ** -11, "tf32").value  # same mantissa


def test_float_bits_known_patterns():
    assert float_bits(1.0, "fp32")[:3] == (0, "01111111", "0" * 23)
    assert float_bits(-2.0, "fp16")[:3] == (1, "10000", "0" * 10)
    assert float_bits(65504.0, "fp16")[:3] == (0, "11110", "1" * 10)
    assert float_bits(1.0, "bf16")[:3] == (0, "01111111", "0" * 7)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="format must be one of"):
        get_format("fp4")
    with pytest.raises(ValueError, match="value must be a number"):
        float_bits("1.0", "fp16")
    with pytest.raises(ValueError, match="exponent bits"):
        decode_bits(0, "111", "000", "fp8_e5m2")
    with pytest.raises(ValueError, match="recipe"):
        model_state_bytes_per_param("fp8")
    for kwargs in ({"init_scale": 0}, {"growth_factor": 1.0}, {"backoff_factor": 1.5}, {"growth_interval": 0},
                   {"init_scale": math.inf}):
        with pytest.raises(ValueError):
            DynamicLossScaler(**kwargs)
    with pytest.raises(ValueError, match="found_inf"):
        DynamicLossScaler().update(1)
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float16))
    p.grad = torch.ones(2, dtype=torch.float16)
    with pytest.raises(ValueError, match="fp32"):
        DynamicLossScaler().unscale_([p])


def test_memory_budget_matches_the_zero_paper():
    mixed = model_state_bytes_per_param("mixed")
    assert sum(mixed.values()) == 16  # ZeRO section 3.1: 2 + 2 + 12
    assert mixed["16-bit weights"] == memory.FP16_PARAM_BYTES
    assert mixed["fp32 master weights"] + mixed["Adam momentum (fp32)"] + mixed["Adam variance (fp32)"] \
        == memory.ADAM_MIXED_PRECISION_OPTIMIZER_BYTES
    assert sum(model_state_bytes_per_param("fp32").values()) == 16
    megatron = model_state_bytes_per_param("mixed-fp32-grads")  # Megatron-LM's README: 18 for bf16 + fp32 grads
    assert sum(megatron.values()) == 18 and megatron["fp32 gradients"] == 4
    assert {k: v for k, v in megatron.items() if k != "fp32 gradients"} == \
        {k: v for k, v in mixed.items() if k != "16-bit gradients"}
    psi = 7.5e9  # and the ZeRO calculator agrees (stage 0, one GPU)
    assert sum(mixed.values()) * psi == memory.zero_model_state_bytes(psi, 1, 0)


def test_scaler_defaults_are_gradscalers():
    ours, theirs = DynamicLossScaler(), torch.amp.GradScaler("cpu")
    assert ours.scale == theirs.get_scale()
    assert ours.growth_factor == theirs.get_growth_factor()
    assert ours.backoff_factor == theirs.get_backoff_factor()
    assert ours.growth_interval == theirs.get_growth_interval()


@pytest.mark.parametrize("sequence", [
    "ffinfffffnffffffffii",
    "iiiiffffffffffffffff",
    "ffffffffffffffffffff",
])
def test_scaler_matches_gradscaler_step_by_step(sequence):
    """The same gradient sequence (f finite, i inf, n NaN) through both: same scale, skips and weights."""
    kwargs = dict(init_scale=2.0 ** 10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    theirs = torch.amp.GradScaler("cpu", **kwargs)
    ours = DynamicLossScaler(**kwargs)
    p_theirs = torch.nn.Parameter(torch.zeros(3))
    p_ours = torch.nn.Parameter(torch.zeros(3))
    opt_theirs = torch.optim.SGD([p_theirs], lr=0.1)
    opt_ours = torch.optim.SGD([p_ours], lr=0.1)
    value = {"f": 1.0, "i": math.inf, "n": math.nan}
    for step, kind in enumerate(sequence):
        grad = torch.tensor([value[kind], 0.5, -2.0 + step])
        theirs.scale(torch.tensor(1.0))
        p_theirs.grad = grad * theirs.get_scale()
        theirs.step(opt_theirs)
        theirs.update()
        p_ours.grad = grad * ours.scale
        found_inf = ours.unscale_([p_ours])
        if not found_inf:
            opt_ours.step()
        ours.update(found_inf)
        assert found_inf == (kind != "f")
        assert ours.scale == theirs.get_scale(), f"step {step}"
        assert ours.good_steps == theirs._get_growth_tracker(), f"step {step}"
        torch.testing.assert_close(p_ours.detach(), p_theirs.detach(), rtol=0, atol=0)


def test_scaler_never_grows_to_inf():
    scaler = DynamicLossScaler(init_scale=2.0 ** 127, growth_interval=1)
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127, growth_interval=1)
    theirs.scale(torch.tensor(1.0))
    p = torch.nn.Parameter(torch.zeros(1))
    p.grad = torch.ones(1)
    theirs.step(torch.optim.SGD([p], lr=0.1))
    theirs.update()
    scaler.update(False)
    assert scaler.scale == theirs.get_scale() == 2.0 ** 127  # 2^128 is inf in fp32: the scale stays


def test_task_underflows_in_fp16_but_not_when_scaled():
    """The lab's premise: a real share of fp16 activation gradients of the first layer round to zero."""
    x, y = make_task()
    model = make_mlp()
    first = model[0](x)
    first.retain_grad()
    loss = ((model[1:](first) - y) ** 2).mean()
    loss.backward()
    g = first.grad.abs().numpy().ravel()
    fp16 = FORMATS["fp16"]
    assert np.mean(g < fp16.smallest_normal) > 0.5  # most are below fp16's normal range already at step 0
    assert np.mean(g * 2.0 ** 12 < fp16.smallest_subnormal / 2) < 0.01


def test_plots_return_figures():
    import matplotlib.pyplot as plt

    from utils.parallel.mixed_precision import precision_plots as pp

    for fig in (pp.plot_bit_layouts(), pp.plot_format_ranges(mark=1e-6),
                pp.plot_gradient_histogram(np.logspace(-10, -2, 50)),
                pp.plot_loss_curves({"a": [1.0, 0.5], "b": [1.0, 0.4]}, reference="a"),
                pp.plot_scale_history([1.0, 2.0, 1.0], [False, True, False])):
        assert isinstance(fig, matplotlib.figure.Figure)
        plt.close(fig)
    with pytest.raises(ValueError):
        pp.plot_gradient_histogram(np.zeros(3))
    with pytest.raises(ValueError):
        pp.plot_bit_layouts(formats=("fp64",))
