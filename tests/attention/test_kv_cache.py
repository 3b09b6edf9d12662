import pytest

from utils.attention import MODELS, kv_cache_bytes, mla_kv_cache_bytes

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
        "Mistral-7B": "GQA", "DeepSeek-V2": "MLA", "DeepSeek-V3": "MLA"}


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
