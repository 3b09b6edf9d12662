import pytest
import torch

from utils.attention import MODELS
from utils.attention.mla import MLA, WEIGHT_NAMES, MLAConfig


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


def _with_nontrivial_norms(mla: MLA) -> MLA:
    """Give both latent RMSNorms random gains, so a norm applied on one path only would show."""
    with torch.no_grad():
        mla.q_norm.weight.uniform_(0.5, 2.0)
        mla.kv_norm.weight.uniform_(0.5, 2.0)
    return mla


def test_latent_rmsnorm_keeps_absorbed_equal_to_naive():
    """DeepSeek-V2 section 3.1.2: RMSNorm after the compressed latents; it precedes W_UK and W_UV, so the
    absorbed form still equals the naive one, and decoding from the normed cache equals the full pass."""
    torch.manual_seed(1)
    mla = _with_nontrivial_norms(MLA(MLAConfig()).double())
    h = 5 * torch.randn(2, 9, 64, dtype=torch.float64)
    full = mla(h)
    torch.testing.assert_close(mla.forward_absorbed(h), full)
    cache: dict = {}
    steps = [mla.forward_absorbed(h[:, :4], cache)] + [mla.forward_absorbed(h[:, t:t + 1], cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_the_cached_latent_is_the_normed_one():
    """What is cached is RMSNorm(W_DKV h) (vLLM's kv_c_normed): per token, RMS of c / gain is 1."""
    torch.manual_seed(2)
    mla = _with_nontrivial_norms(MLA(MLAConfig()).double())
    h = 7 * torch.randn(1, 5, 64, dtype=torch.float64)
    cache: dict = {}
    mla.forward_absorbed(h, cache)
    unscaled = cache["c_kv"] / mla.kv_norm.weight
    torch.testing.assert_close(unscaled.pow(2).mean(-1), torch.ones(1, 5, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    raw = mla.w_dkv(h)
    assert not torch.allclose(cache["c_kv"], raw)


def test_weight_names_cover_every_projection_of_the_layer():
    """Every matrix of the layer has its checkpoint name; the names are the ones HF and vLLM load."""
    names = {name for name, _ in WEIGHT_NAMES.values()}
    assert names == {"q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm",
                     "kv_b_proj", "o_proj"}
    covered = " ".join(WEIGHT_NAMES)
    for matrix in ("W_DQ", "W_UQ", "W_QR", "W_DKV", "W_KR", "W_UK", "W_UV", "W_O"):
        assert matrix in covered


def test_scores_are_scaled_by_the_root_of_d_h_plus_d_h_rope_by_hand():
    # One head, d_h = d_c = d_c' = 2, d_h^R = 2: identity projections except W_UQ = ln 3 I, and no RoPE part
    # (W_QR = W_KR = 0). Tokens h = (1, 1) and (1, -1) have RMS 1, so the latents are the tokens themselves.
    # Token 1's scores against keys (1, 1), (1, -1) are (0, 2 ln 3); over sqrt(d_h + d_h^R) = 2 they are
    # (0, ln 3), weights (1/4, 3/4), output (1, 1/4 - 3/4). Over sqrt(d_h) alone the weights would be 1 : 3^1.41.
    mla = MLA(MLAConfig(dim=2, n_heads=1, head_dim=2, kv_lora_rank=2, q_lora_rank=2, rope_head_dim=2)).double()
    eye = torch.eye(2, dtype=torch.float64)
    with torch.no_grad():
        for layer in (mla.w_dkv, mla.w_uk, mla.w_uv, mla.w_dq, mla.w_o):
            layer.weight.copy_(eye)
        mla.w_uq.weight.copy_(eye * torch.tensor(3.0, dtype=torch.float64).log())
        mla.w_qr.weight.zero_()
        mla.w_kr.weight.zero_()
    h = torch.tensor([[[1.0, 1.0], [1.0, -1.0]]], dtype=torch.float64)
    expected = torch.tensor([[[1.0, 1.0], [1.0, -0.5]]], dtype=torch.float64)
    torch.testing.assert_close(mla(h), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mla.forward_absorbed(h), expected, rtol=1e-5, atol=1e-5)
