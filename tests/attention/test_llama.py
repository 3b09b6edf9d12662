import pytest
import torch
import torch.nn.functional as F

from utils.attention.llama import (
    Attention,
    LlamaConfig,
    TinyLlama,
    apply_rope,
    rms_norm,
    rope_angles,
    swiglu_hidden_size,
)


def test_rms_norm_matches_the_formula_and_torch():
    torch.manual_seed(0)
    x, g = torch.randn(3, 5, 16), torch.randn(16)
    expected = x / torch.sqrt((x ** 2).mean(-1, keepdim=True) + 1e-6) * g
    torch.testing.assert_close(rms_norm(x, g), expected)
    if hasattr(F, "rms_norm"):
        torch.testing.assert_close(rms_norm(x, g), F.rms_norm(x, (16,), g, eps=1e-6))


def test_swiglu_hidden_size_of_llama_7b_is_11008():
    """LLaMA-7B: dim 4096, FFN 11008 (Touvron et al. 2023; config.json of the released model)."""
    assert swiglu_hidden_size(4096) == 11008


def test_rope_scores_depend_only_on_the_offset():
    torch.manual_seed(0)
    q, k = torch.randn(64, dtype=torch.float64), torch.randn(64, dtype=torch.float64)

    def score(m, n):
        cos, sin = rope_angles(max(m, n) + 1, 64)
        qs = apply_rope(q.float().expand(max(m, n) + 1, 64), cos, sin)
        ks = apply_rope(k.float().expand(max(m, n) + 1, 64), cos, sin)
        return float(qs[m] @ ks[n])

    assert score(7, 3) == pytest.approx(score(104, 100), abs=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-4)


def test_rope_is_a_rotation():
    x = torch.randn(10, 32)
    cos, sin = rope_angles(10, 32)
    torch.testing.assert_close(apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1))
    with pytest.raises(ValueError, match="even"):
        rope_angles(4, 7)


def _reference_attention(attn: Attention, x: torch.Tensor) -> torch.Tensor:
    """The same attention through SDPA with explicit per-head K/V copies."""
    c, (b, s, _) = attn.config, x.shape
    q = attn.wq(x).view(b, s, c.n_heads, c.head_dim).transpose(1, 2)
    k = attn.wk(x).view(b, s, c.n_kv_heads, c.head_dim).transpose(1, 2)
    v = attn.wv(x).view(b, s, c.n_kv_heads, c.head_dim).transpose(1, 2)
    cos, sin = rope_angles(s, c.head_dim)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    group = c.n_heads // c.n_kv_heads
    k = torch.cat([k[:, h // group:h // group + 1] for h in range(c.n_heads)], dim=1)
    v = torch.cat([v[:, h // group:h // group + 1] for h in range(c.n_heads)], dim=1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return attn.wo(out.transpose(1, 2).reshape(b, s, -1))


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_gqa_attention_matches_sdpa(n_kv_heads):
    torch.manual_seed(0)
    attn = Attention(LlamaConfig(dim=32, n_heads=4, n_kv_heads=n_kv_heads))
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(attn(x), _reference_attention(attn, x))


@pytest.mark.parametrize("n_kv_heads", [4, 1])
def test_cached_decoding_gives_the_same_tokens_and_logits(n_kv_heads):
    torch.manual_seed(0)
    model = TinyLlama(LlamaConfig(n_kv_heads=n_kv_heads)).eval()
    prompt = torch.randint(0, 256, (2, 5))
    torch.testing.assert_close(model.generate(prompt, 8, use_cache=True), model.generate(prompt, 8, use_cache=False))
    caches = [{} for _ in model.blocks]
    full = model(torch.cat([prompt, prompt], dim=1))
    model(prompt, caches)
    torch.testing.assert_close(model(prompt, caches), full[:, 5:], rtol=1e-5, atol=1e-5)
    assert caches[0]["k"].shape == (2, n_kv_heads, 10, 16)


@pytest.mark.parametrize("kwargs, match", [(dict(dim=30), "multiple of n_heads"),
                                           (dict(n_kv_heads=3), "multiple of n_kv_heads"),
                                           (dict(n_layers=0), "n_layers")])
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig(**kwargs)


def test_llama_7b_sizes_give_its_published_parameter_count():
    """LLaMA-7B (Touvron et al. 2023, Table 2: dim 4096, 32 heads, 32 layers; vocab 32000, FFN 11008):
    6,738,415,616 parameters, the count of the released checkpoint ("6.7B")."""
    with torch.device("meta"):
        model = TinyLlama(LlamaConfig(vocab=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=32))
    assert sum(p.numel() for p in model.parameters()) == 6_738_415_616


def test_rope_angles_land_on_the_requested_device():
    from utils.attention.llama import rope_angles
    from utils.device import device

    cos, sin = rope_angles(5, 8, device=device())
    assert cos.device.type == sin.device.type == device().type and cos.dtype == torch.float32
    cpu_cos, _ = rope_angles(5, 8)
    assert cpu_cos.device.type == "cpu"
    torch.testing.assert_close(cos.cpu(), cpu_cos)


def test_block_normalises_the_mlp_input_with_its_own_gain_by_hand():
    # dim 2, one head, W_O = 0 so attention adds nothing (h = x); W_1 = W_2 = W_3 = I. x = (1, -1) has RMS 1,
    # so the MLP sees n = x * ffn_norm = (2, 0) and adds (2 SiLU(2), 0) = (4 / (1 + e^-2), 0): out = (4.5232, -1).
    # The attention's gain (5, 5) in its place would give n = (5, -5) and a very different output.
    from utils.attention.llama import Block
    block = Block(LlamaConfig(dim=2, n_heads=1, n_kv_heads=1, ffn_hidden=2)).double()
    with torch.no_grad():
        block.attn_norm.fill_(5.0)
        block.ffn_norm.copy_(torch.tensor([2.0, 0.0]))
        block.attn.wo.weight.zero_()
        for layer in (block.w1, block.w2, block.w3):
            layer.weight.copy_(torch.eye(2))
    out = block(torch.tensor([[[1.0, -1.0]]], dtype=torch.float64))
    silu_2 = 2 / (1 + torch.tensor(-2.0, dtype=torch.float64).exp())
    torch.testing.assert_close(out, torch.stack([1 + 2 * silu_2, torch.tensor(-1.0, dtype=torch.float64)]).view(1, 1, 2),
                               rtol=1e-5, atol=1e-5)  # RMSNorm runs in fp32 with eps 1e-6
