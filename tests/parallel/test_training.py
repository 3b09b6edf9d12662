import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from utils.gpu.hardware import spec
from utils.parallel.training import (
    PUBLISHED,
    SECONDS_PER_DAY,
    SECONDS_PER_YEAR,
    backward_flops,
    forward_flops,
    model_flops_utilization,
    training_flops,
    training_seconds,
)

A100_BF16 = spec("A100-SXM4-80GB").flops("bf16")  # 312 TFLOP/s dense, NVIDIA A100 datasheet


def test_gpt3_175b_matches_table_d1():
    # Brown et al. (arXiv:2005.14165), Table D.1: 174,600M parameters, 300B tokens, 3.14E+23 FLOPs.
    flops = training_flops(PUBLISHED["gpt3_175b_params"].value, PUBLISHED["gpt3_175b_tokens"].value)
    assert flops == pytest.approx(PUBLISHED["gpt3_175b_train_flops"].value, rel=5e-3)


def test_forward_is_a_third_and_backward_two_thirds():
    assert forward_flops(1e9, 1e6) == 2e15
    assert backward_flops(1e9, 1e6) == 4e15
    assert training_flops(1e9, 1e6) == 6e15


def test_six_flops_per_param_per_token_as_torch_counts_them():
    # A bias-free MLP whose input needs a gradient (as inside a deep network): torch's own
    # FLOP counter must find 2 N D in the forward and 4 N D in the backward pass.
    torch.manual_seed(0)
    d, tokens = 32, 16
    mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d, bias=False), torch.nn.GELU(),
                              torch.nn.Linear(4 * d, d, bias=False))
    n_params = sum(p.numel() for p in mlp.parameters())
    x = torch.randn(tokens, d, requires_grad=True)
    with FlopCounterMode(display=False) as fwd:
        y = mlp(x)
    with FlopCounterMode(display=False) as bwd:
        y.sum().backward()
    assert fwd.get_total_flops() == forward_flops(n_params, tokens)
    assert bwd.get_total_flops() == backward_flops(n_params, tokens)


def test_llama_65b_implies_an_mfu_near_palms():
    # Touvron et al. (arXiv:2302.13971), section 2.4: 2048 A100-80GB, ~21 days, 1.4T tokens, ~380 tokens/s/GPU.
    n_params, n_tokens = PUBLISHED["llama_65b_params"].value, PUBLISHED["llama_65b_tokens"].value
    n_gpus = int(PUBLISHED["llama_65b_gpus"].value)
    days = PUBLISHED["llama_65b_days"].value
    mfu_from_days = model_flops_utilization(n_params, n_tokens, days * SECONDS_PER_DAY, n_gpus, A100_BF16)
    mfu_from_rate = model_flops_utilization(n_params, PUBLISHED["llama_65b_tokens_per_s_per_gpu"].value,
                                            1.0, 1, A100_BF16)
    assert mfu_from_days == pytest.approx(0.472, abs=0.005)
    assert mfu_from_rate == pytest.approx(0.476, abs=0.005)
    # The two figures of the paper agree with each other through 6ND, and with PaLM's 46.2% (Table 3).
    assert mfu_from_days == pytest.approx(mfu_from_rate, abs=0.01)
    assert mfu_from_days == pytest.approx(PUBLISHED["palm_540b_mfu"].value, abs=0.03)


def test_llama_65b_days_from_its_throughput():
    n_params, n_tokens = PUBLISHED["llama_65b_params"].value, PUBLISHED["llama_65b_tokens"].value
    mfu = model_flops_utilization(n_params, PUBLISHED["llama_65b_tokens_per_s_per_gpu"].value, 1.0, 1, A100_BF16)
    seconds = training_seconds(training_flops(n_params, n_tokens), int(PUBLISHED["llama_65b_gpus"].value),
                               A100_BF16, mfu)
    assert seconds / SECONDS_PER_DAY == pytest.approx(PUBLISHED["llama_65b_days"].value, rel=0.02)


def test_1e24_flops_at_2_pflops_takes_about_16_years():
    assert training_seconds(1e24, 1, 2e15, 1.0) / SECONDS_PER_YEAR == pytest.approx(15.84, abs=0.01)


def test_more_gpus_take_proportionally_less_time():
    assert training_seconds(1e21, 64, 1e15, 0.5) == pytest.approx(training_seconds(1e21, 8, 1e15, 0.5) / 8)


@given(st.floats(1e6, 1e13), st.floats(1e6, 1e14), st.integers(1, 100_000), st.floats(1e12, 1e16),
       st.floats(0.01, 1.0))
def test_mfu_inverts_training_seconds(n_params, n_tokens, n_gpus, peak, mfu):
    seconds = training_seconds(training_flops(n_params, n_tokens), n_gpus, peak, mfu)
    assert model_flops_utilization(n_params, n_tokens, seconds, n_gpus, peak) == pytest.approx(mfu, rel=1e-9)


def test_every_published_figure_names_its_source():
    for name, figure in PUBLISHED.items():
        assert figure.value > 0 and figure.unit, name
        assert "arXiv:" in figure.source, name


@pytest.mark.parametrize("call", [
    lambda: training_flops(0, 1e9),
    lambda: training_flops(1e9, -1),
    lambda: training_flops(True, 1e9),
    lambda: training_seconds(1e20, 0, 1e15, 0.5),
    lambda: training_seconds(1e20, 2.5, 1e15, 0.5),
    lambda: training_seconds(1e20, 8, 0, 0.5),
    lambda: training_seconds(1e20, 8, 1e15, 0),
    lambda: training_seconds(1e20, 8, 1e15, 1.5),
    lambda: model_flops_utilization(1e9, 1e9, 0, 8, 1e15),
    lambda: model_flops_utilization(1e9, 1e9, 10, 0, 1e15),
])
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()
