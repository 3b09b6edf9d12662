import pytest

from utils.attention import MODELS
from utils.attention.decode_cost import (decode_step_cost, decode_tokens_per_second, max_batch, param_count,
                                        params_read_per_step)
from utils.attention.llama_sizes import llama_param_count
from utils.gpu import hardware
from utils.gpu.roofline import ridge_point

LLAMA2_7B, LLAMA3_8B = MODELS["LLaMA-2-7B"], MODELS["Llama-3-8B"]


@pytest.mark.parametrize("config, intermediate, vocab, published", [
    (LLAMA2_7B, 11008, 32000, 6_738_415_616),   # huggingface.co/meta-llama/Llama-2-7b-hf: "6.74B params"
    (LLAMA3_8B, 14336, 128256, 8_030_261_248),  # huggingface.co/meta-llama/Meta-Llama-3-8B: "8.03B params"
])
def test_param_count_matches_the_published_models(config, intermediate, vocab, published):
    count = llama_param_count(config.hidden, config.n_layers, vocab, intermediate, config.n_heads, config.n_kv_heads)
    assert count == published


def test_batch_one_decode_reads_the_weights_once_per_token():
    """Batch 1, no cache: the step is bytes / bandwidth = 2 N / 3.35e12 s, about 250 tokens/s for 6.74B."""
    n = 6.738e9
    tps = decode_tokens_per_second(n, LLAMA2_7B, batch=1, context=0)
    assert tps == pytest.approx(hardware.spec("H100-SXM").hbm_bandwidth / (2 * n))


def test_intensity_grows_with_batch_while_weights_dominate():
    """2N B FLOPs over 2N bytes: B FLOPs per byte in fp16."""
    for batch in (1, 8, 64):
        assert decode_step_cost(7e9, LLAMA2_7B, batch, context=0).intensity == pytest.approx(batch)


@pytest.mark.parametrize("config, ratio", [(LLAMA2_7B, 1), (LLAMA3_8B, 4)])
def test_cache_dominated_intensity_is_the_gqa_ratio(config, ratio):
    """With a tiny model and long caches, intensity -> 4 L H d S / (2 L H_kv d S * 2 bytes) = H / H_kv."""
    cost = decode_step_cost(1.0, config, batch=256, context=100_000)
    assert cost.intensity == pytest.approx(ratio, rel=1e-3)


def test_decode_becomes_compute_bound_only_past_the_ridge_point():
    ridge = ridge_point("H100-SXM", "fp16")  # 295 FLOPs/byte
    below = decode_tokens_per_second(7e9, LLAMA2_7B, batch=256, context=0)
    above = decode_tokens_per_second(7e9, LLAMA2_7B, batch=512, context=0)
    peak = hardware.spec("H100-SXM").flops("fp16")
    assert below == pytest.approx(256 * 3.35e12 / 14e9) and ridge > 256
    assert above == pytest.approx(peak / 14e9)  # 2N FLOPs per token at peak


def test_max_batch_fits_caches_beside_weights():
    # LLaMA-2-7B, 2048 tokens: 1 GiB of cache per sequence; 80 GB - 13.48 GB leaves room for 61
    n = 6_738_415_616
    assert max_batch(n, LLAMA2_7B, 2048) == int((80e9 - 2 * n) // 2**30) == 61


def test_bad_input_raises():
    with pytest.raises(ValueError, match="batch"):
        decode_step_cost(7e9, LLAMA2_7B, batch=0, context=10)
    with pytest.raises(ValueError, match="do not fit"):
        max_batch(70e9, LLAMA2_7B, 2048)


@pytest.mark.parametrize("model, published", [("LLaMA-2-7B", 6_738_415_616), ("Llama-3-8B", 8_030_261_248),
                                              ("Mistral-7B", 7_241_732_096)])  # Mistral: "7.24B params"
def test_param_count_by_name(model, published):
    assert param_count(model) == published
    hidden, vocab = MODELS[model].hidden, {"LLaMA-2-7B": 32000, "Llama-3-8B": 128256, "Mistral-7B": 32000}[model]
    assert param_count(model) - params_read_per_step(model) == hidden * vocab


def test_unknown_model_raises():
    with pytest.raises(ValueError, match="known: LLaMA-2-7B"):
        param_count("GPT-2")


def test_a_sliding_window_caps_the_cache_a_decode_step_reads():
    """Mistral-7B keeps its last 4096 tokens (arXiv:2310.06825): a step at 32k costs what one at 4096 does."""
    from utils.attention import MODELS
    from utils.attention.decode_cost import decode_step_cost, max_batch, param_count, params_read_per_step
    mistral, n = MODELS["Mistral-7B"], params_read_per_step("Mistral-7B")
    assert decode_step_cost(n, mistral, 8, 32768) == decode_step_cost(n, mistral, 8, 4096)
    assert decode_step_cost(n, mistral, 8, 2048).nbytes < decode_step_cost(n, mistral, 8, 4096).nbytes
    assert max_batch(param_count("Mistral-7B"), mistral, 32768) == max_batch(param_count("Mistral-7B"), mistral, 4096)
