import pytest
import torch

from utils.attention import MODELS
from utils.attention.mla import MLA, MLAConfig


def test_absorbed_mla_equals_naive_mla():
    torch.manual_seed(0)
    mla = MLA(MLAConfig()).double()
    h = torch.randn(2, 9, 64, dtype=torch.float64)
    torch.testing.assert_close(mla.forward_absorbed(h), mla(h))


def test_decoding_from_the_latent_cache_equals_the_full_pass():
    torch.manual_seed(0)
    config = MLAConfig()
    mla = MLA(config).double()
    h = torch.randn(1, 12, 64, dtype=torch.float64)
    full = mla(h)
    cache: dict = {}
    steps = [mla.forward_absorbed(h[:, :5], cache)] + [mla.forward_absorbed(h[:, t:t + 1], cache) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    assert cache["c_kv"].shape == (1, 12, config.kv_lora_rank)
    assert cache["k_r"].shape == (1, 12, config.rope_head_dim)


def test_the_cache_holds_d_c_plus_rope_numbers_per_token():
    """Per token and layer MLA caches d_c + d_h^R numbers; MHA would cache 2 n_h d_h."""
    config = MLAConfig()
    cache: dict = {}
    MLA(config).forward_absorbed(torch.randn(1, 4, 64), cache)
    per_token = sum(t[0, 0].numel() for t in cache.values())
    deepseek = MODELS["DeepSeek-V2"]
    assert per_token == config.kv_lora_rank + config.rope_head_dim
    assert deepseek.cache_bytes(bytes_per_elem=1) == (deepseek.kv_lora_rank + deepseek.rope_head_dim) * deepseek.n_layers


def test_rope_dimension_must_be_even():
    with pytest.raises(ValueError, match="even"):
        MLAConfig(rope_head_dim=7)
