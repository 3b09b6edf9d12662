import pytest

from utils.attention import MODELS, kv_cache_bytes, mla_kv_cache_bytes
from utils.attention.kv_cache import cached_tokens, kv_cache_reduction

KIB = 1024


@pytest.mark.parametrize("name, kib", [("LLaMA-2-7B", 512), ("LLaMA-2-70B", 320)])
def test_llama2_cache_per_token_in_fp16(name, kib):
    assert MODELS[name].cache_bytes() == kib * KIB


def test_vllm_paper_opt_13b_figure():
    """vLLM (arXiv:2309.06180), section 3: one token of OPT-13B needs 2 x 5120 x 40 x 2 bytes = 800 KB."""
    assert kv_cache_bytes(n_layers=40, n_kv_heads=40, head_dim=128) == 800 * KIB


def test_deepseek_v2_mla_cache_is_4_5_head_dims_per_layer():
    """DeepSeek-V2 (arXiv:2405.04434), Table 1: MLA caches (d_c + d_h^R) l = 9/2 d_h l elements per token,
    "equivalent to GQA with only 2.25 groups"."""
    config = MODELS["DeepSeek-V2"]
    elements = config.cache_bytes(bytes_per_elem=1)
    assert elements == 4.5 * config.head_dim * config.n_layers
    assert elements == kv_cache_bytes(config.n_layers, 1, config.head_dim, bytes_per_elem=1) * 2.25
    assert config.kind == "MLA"
    assert mla_kv_cache_bytes(60, 512, 64, seq_len=1000, batch=2, bytes_per_elem=2) == 576 * 60 * 1000 * 2 * 2


def test_cache_scales_with_tokens_batch_and_dtype():
    one = kv_cache_bytes(32, 8, 128)
    assert kv_cache_bytes(32, 8, 128, seq_len=4096, batch=3, bytes_per_elem=4) == one * 4096 * 3 * 2


def test_kinds():
    assert {name: c.kind for name, c in MODELS.items()} == {
        "LLaMA-2-7B": "MHA", "LLaMA-2-70B": "GQA", "Llama-3-8B": "GQA", "Llama-3-70B": "GQA",
        "Mistral-7B": "GQA", "DeepSeek-67B": "GQA", "DeepSeek-V2": "MLA", "DeepSeek-V3": "MLA"}


@pytest.mark.parametrize("call, match", [
    (lambda: kv_cache_bytes(-1, 8, 128), "n_layers"),
    (lambda: kv_cache_bytes(32, 8, 128, seq_len=0), "seq_len"),
    (lambda: kv_cache_bytes(32, 8, 128, bytes_per_elem=3), "bytes_per_elem"),
    (lambda: mla_kv_cache_bytes(60, 512, -64), "rope_head_dim"),
    (lambda: mla_kv_cache_bytes(60, 0, 64), "kv_lora_rank"),
])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# The fields of each model's config.json on the Hugging Face Hub (num_hidden_layers, hidden_size,
# num_attention_heads, num_key_value_heads; for DeepSeek also kv_lora_rank, qk_rope_head_dim and
# qk_nope_head_dim = v_head_dim; for Mistral sliding_window), typed from the files. LLaMA-2-7B's config
# does list num_key_value_heads: 32 (one K/V head per query head: MHA).
CONFIG_JSON = {
    "LLaMA-2-7B": dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=32),
    "LLaMA-2-70B": dict(num_hidden_layers=80, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8),
    "Llama-3-8B": dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8),
    "Llama-3-70B": dict(num_hidden_layers=80, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8),
    "Mistral-7B": dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                       sliding_window=4096),
    "DeepSeek-67B": dict(num_hidden_layers=95, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8),
    "DeepSeek-V2": dict(num_hidden_layers=60, hidden_size=5120, num_attention_heads=128, kv_lora_rank=512,
                        qk_rope_head_dim=64, qk_nope_head_dim=128),
    "DeepSeek-V3": dict(num_hidden_layers=61, hidden_size=7168, num_attention_heads=128, kv_lora_rank=512,
                        qk_rope_head_dim=64, qk_nope_head_dim=128),
}


@pytest.mark.parametrize("name", list(CONFIG_JSON))
def test_models_match_their_config_json(name):
    config, ref = MODELS[name], CONFIG_JSON[name]
    assert (config.n_layers, config.hidden, config.n_heads) == (
        ref["num_hidden_layers"], ref["hidden_size"], ref["num_attention_heads"])
    if "kv_lora_rank" in ref:
        assert (config.kv_lora_rank, config.rope_head_dim, config.head_dim) == (
            ref["kv_lora_rank"], ref["qk_rope_head_dim"], ref["qk_nope_head_dim"])
    else:
        assert config.n_kv_heads == ref["num_key_value_heads"]
        assert config.head_dim == ref["hidden_size"] // ref["num_attention_heads"]
    assert config.sliding_window == ref.get("sliding_window")


def test_every_model_is_checked_against_its_config():
    assert set(CONFIG_JSON) == set(MODELS)


def test_deepseek_v2_against_67b_recomputes_the_papers_93_3_percent():
    """DeepSeek-V2 (arXiv:2405.04434) abstract: MLA "reduces the KV cache by 93.3%" against DeepSeek 67B.

    Per token: 67B caches 2 x 95 x 8 x 128 = 194,560 elements, V2 60 x 576 = 34,560. At equal precision
    that is 82.2 %; with V2's cache at 6 bits on average (section 3.2.3) against 16-bit 67B, 93.3 %.
    """
    v2, base = MODELS["DeepSeek-V2"], MODELS["DeepSeek-67B"]
    assert base.cache_elements_per_token() == 2 * 95 * 8 * 128 == 194_560
    assert v2.cache_elements_per_token() == 60 * 576 == 34_560
    assert kv_cache_reduction(base, v2) == pytest.approx(1 - 34_560 / 194_560)
    assert round(100 * kv_cache_reduction(base, v2), 1) == 82.2
    assert round(100 * kv_cache_reduction(base, v2, baseline_bits=16, model_bits=6), 1) == 93.3
    with pytest.raises(ValueError, match="bits"):
        kv_cache_reduction(base, v2, model_bits=0)


def test_sliding_window_caps_the_cache_at_w_tokens():
    """Mistral 7B (arXiv:2310.06825), section 2: with W = 4096 the rolling buffer cuts the cache 8x at 32k."""
    mistral = MODELS["Mistral-7B"]
    assert cached_tokens(100, 4096) == 100 and cached_tokens(32768, 4096) == 4096 and cached_tokens(32768) == 32768
    assert mistral.cache_bytes(seq_len=4096) == mistral.cache_bytes(seq_len=32768)
    assert mistral.cache_bytes(seq_len=32768, use_window=False) == 8 * mistral.cache_bytes(seq_len=32768)
    assert kv_cache_bytes(32, 8, 128, seq_len=5000, window=4096) == kv_cache_bytes(32, 8, 128, seq_len=4096)
    with pytest.raises(ValueError, match="window"):
        cached_tokens(10, 0)
