import pytest

from utils.attention.decode_cost import decode_step_cost, params_read_per_step
from utils.attention.kv_cache import MODELS
from utils.gpu import hardware
from utils.serving.quantisation.quant import bytes_per_weight
from utils.serving.quantisation.quant_cost import (SCHEMES, Scheme, decode_bound, quantised_decode_cost, quantised_model,
                                      scheme_bytes)
from utils.serving.costs.step_time import served_model, step_cost


def test_fp16_equals_part_three_decode_cost():
    n = params_read_per_step("Llama-3-8B")
    for model, batch, context in (("Llama-3-8B", 1, 0), ("Llama-3-8B", 8, 1024), ("Llama-3-8B", 64, 4096),
                                  ("Mistral-7B", 4, 8192)):  # Mistral's sliding window keeps 4,096 tokens
        ref = decode_step_cost(params_read_per_step(model), MODELS[model], batch, context, 2)
        got = quantised_decode_cost(model, batch, context).total
        assert got.flops == ref.flops and got.nbytes == ref.nbytes
    assert quantised_decode_cost("Llama-3-8B", 8, 1024) == step_cost(served_model("Llama-3-8B"), [1024] * 8)
    assert n == served_model("Llama-3-8B").n_params


def test_bytes_split_into_weights_and_cache():
    n, c = params_read_per_step("Llama-3-8B"), MODELS["Llama-3-8B"]
    cost = quantised_decode_cost("Llama-3-8B", 16, 2048, weight_bytes=0.5, kv_bytes=1.0)
    assert cost.linear.nbytes == pytest.approx(0.5 * n)
    assert cost.attention.nbytes == pytest.approx(2 * c.n_layers * c.n_kv_heads * c.head_dim * 2048 * 16)
    assert cost.linear.flops == 2 * n * 16  # the arithmetic does not depend on the storage format
    assert quantised_model("Llama-3-8B", 0.5, 1.03125).kv_bytes_per_token == 2 * 32 * 8 * 128 * 1.03125


def test_decode_bound_sums_the_two_kernels_by_hand():
    """Llama-3-8B, batch 256 with 1,024-token contexts, int4 weights on an H100: 512 FLOPs per byte of weights
    puts the weight matmuls past the fp16 ridge (295), so they take their FLOPs' time, and attention its fp16
    cache's bytes. Summed: 18,104 tokens/s. The single max over the step would hide the matmuls behind the
    caches' bytes and give 22,399; int8 weights give the same 18,104, since past the ridge the weights' bytes
    no longer count."""
    n, peak, bandwidth = params_read_per_step("Llama-3-8B"), 989.4e12, 3.35e12
    batch, context, cache = 256, 1024, 2 * 32 * 8 * 128 * 2
    by_hand = batch / (2 * n * batch / peak + batch * context * cache / bandwidth)
    row = decode_bound("Llama-3-8B", SCHEMES["int4 weights, g128"], batch, context)
    assert row["tokens/s"] == pytest.approx(by_hand, rel=1e-12)
    assert by_hand == pytest.approx(18_104, abs=1)
    assert row["weights FLOPs/byte"] == pytest.approx(2 * batch / bytes_per_weight(4, 128))
    assert row["attention FLOPs/byte"] == pytest.approx(4 * 32 / (2 * 8 * 2))  # 2 H / (H_kv b)
    assert decode_bound("Llama-3-8B", SCHEMES["int8 weights"], batch, context)["tokens/s"] == pytest.approx(by_hand)
    overlap = batch / max((2 * n * batch + 4 * 32 * 32 * 128 * context * batch) / peak,
                          (n * bytes_per_weight(4, 128) + batch * context * cache) / bandwidth)
    assert overlap == pytest.approx(22_399, abs=1) and row["tokens/s"] < 0.81 * overlap
    # FP8 W8A8 multiplies at twice the peak: at this batch it beats int4 weights even with an int8 cache
    fp8 = decode_bound("Llama-3-8B", SCHEMES["FP8 W8A8 + FP8 KV"], batch, context)["tokens/s"]
    assert fp8 > decode_bound("Llama-3-8B", SCHEMES["int4 weights + int8 KV"], batch, context)["tokens/s"]


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
    with pytest.raises(ValueError, match="unknown model"):
        decode_bound("GPT-5", SCHEMES["fp16"], 1, 10)


def test_plot_draws_only_batches_that_fit():
    from utils.serving.quantisation.quant_cost import plot_decode_bound
    fig = plot_decode_bound("Llama-3-8B", context=32768, max_batch=256)
    fp16_line = fig.axes[1].lines[0]
    assert max(fp16_line.get_xdata()) < 256  # fp16 caches of 32K tokens fill 80 GB well before batch 256
    with pytest.raises(ValueError, match="unknown model"):
        plot_decode_bound("GPT-5")
