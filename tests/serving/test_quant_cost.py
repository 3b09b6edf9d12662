import pytest

from utils.attention.decode_cost import decode_step_cost, params_read_per_step
from utils.attention.kv_cache import MODELS
from utils.gpu import hardware
from utils.serving.quant import bytes_per_weight
from utils.serving.quant_cost import SCHEMES, Scheme, decode_bound, quantised_decode_cost, scheme_bytes


def test_fp16_equals_part_three_decode_cost():
    n = params_read_per_step("Llama-3-8B")
    for batch, context in ((1, 0), (8, 1024), (64, 4096)):
        ref = decode_step_cost(n, MODELS["Llama-3-8B"], batch, context, 2)
        got = quantised_decode_cost("Llama-3-8B", batch, context)
        assert got.flops == ref.flops and got.nbytes == ref.nbytes


def test_bytes_split_into_weights_and_cache():
    n, c = params_read_per_step("Llama-3-8B"), MODELS["Llama-3-8B"]
    cost = quantised_decode_cost("Llama-3-8B", 16, 2048, weight_bytes=0.5, kv_bytes=1.0)
    assert cost.nbytes == pytest.approx(0.5 * n + 2 * c.n_layers * c.n_kv_heads * c.head_dim * 2048 * 16)


def test_int4_at_batch_one_is_bandwidth_bound_and_faster_by_the_byte_ratio():
    fp16 = decode_bound("Llama-3-8B", SCHEMES["fp16"], 1, 0)
    int4 = decode_bound("Llama-3-8B", SCHEMES["int4 weights, g128"], 1, 0)
    assert int4["tokens/s"] / fp16["tokens/s"] == pytest.approx(2 / bytes_per_weight(4, 128))
    assert fp16["tokens/s"] == pytest.approx(hardware.spec("H100-SXM").hbm_bandwidth
                                             / (2 * params_read_per_step("Llama-3-8B")))


def test_at_long_context_and_large_batch_the_kv_format_matters_more_than_the_weights():
    long = dict(model="Llama-3-8B", batch=128, context=32768)
    base = decode_bound(scheme=SCHEMES["fp16"], **long)["tokens/s"]
    weights_only = decode_bound(scheme=SCHEMES["int4 weights, g128"], **long)["tokens/s"]
    kv_only = decode_bound(scheme=Scheme(kv="fp8_e4m3"), **long)["tokens/s"]
    assert kv_only / base > 1.8 and weights_only / base < 1.1


def test_scheme_bytes():
    assert scheme_bytes(SCHEMES["fp16"], 128) == (2.0, 2.0)
    assert scheme_bytes(SCHEMES["int4 weights + int8 KV"], 128) == (0.5 + 3 / 128, 1 + 4 / 128)
    assert scheme_bytes(SCHEMES["FP8 W8A8 + FP8 KV"], 128) == (1.0, 1.0)
    with pytest.raises(ValueError, match="batch"):
        quantised_decode_cost("Llama-3-8B", 0, 10)


def test_plot_draws_only_batches_that_fit():
    from utils.serving.quant_cost import plot_decode_bound
    fig = plot_decode_bound("Llama-3-8B", context=32768, max_batch=256)
    fp16_line = fig.axes[1].lines[0]
    assert max(fp16_line.get_xdata()) < 256  # fp16 caches of 32K tokens fill 80 GB well before batch 256
    with pytest.raises(ValueError, match="unknown model"):
        plot_decode_bound("GPT-5")
