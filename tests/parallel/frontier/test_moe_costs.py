"""utils.parallel.frontier.moe_costs: counts against a built layer's parameters, and the stated sizes of Mixtral 8x7B
and DeepSeek-V3 recovered from their configurations."""

import pytest

from utils.parallel.frontier import moe_costs as mc
from utils.parallel.frontier.moe import MoELayer


def test_counts_match_a_built_layer():
    layer = MoELayer(8, 12, n_experts=4, top_k=2, n_shared=1)
    model = mc.MoEModel(hidden=8, n_layers=1, vocab=10, attention_params=100, n_routed=4, top_k=2, expert_ffn=12,
                        n_shared=1)
    counts = mc.moe_param_counts(model)
    outside = 2 * 10 * 8 + 8 + 100 + 2 * 8  # embeddings, final norm, attention, two norms
    assert counts["total"] - outside == sum(p.numel() for p in layer.parameters())
    routed_one = sum(p.numel() for p in layer.experts[0].parameters())
    assert counts["total"] - counts["activated"] == (4 - 2) * routed_one
    assert mc.forward_flops_per_token(model) == 2 * (counts["activated"] - 10 * 8)


def test_attention_counts():
    assert mc.gqa_attention_params(4096, 32, 32, 128) == 4 * 4096**2  # MHA: four h x h matrices
    # MLA at DeepSeek-V3's sizes, term by term (arXiv:2405.04434 eqs. 9-14 with the RoPE parts).
    q = 7168 * 1536 + 1536 + 1536 * 128 * 192
    kv = 7168 * 576 + 512 + 512 * 128 * 256
    assert mc.mla_attention_params(7168, 128, 1536, 512, 128, 64, 128) == q + kv + 128 * 128 * 7168


@pytest.mark.parametrize("name, total_key, active_key, active_rel", [
    ("Mixtral 8x7B", "mixtral_total_params", "mixtral_active_params", 0.005),
    # 37.55B counted against "37B": the report rounds down (or leaves out the 0.93B input embedding: 36.6B).
    ("DeepSeek-V3", "deepseek_v3_total_params", "deepseek_v3_activated_params", 0.02),
])
def test_published_sizes(name, total_key, active_key, active_rel):
    counts = mc.moe_param_counts(mc.MODELS[name])
    assert counts["total"] == pytest.approx(mc.PUBLISHED[total_key].value, rel=0.001)
    assert counts["activated"] == pytest.approx(mc.PUBLISHED[active_key].value, rel=active_rel)


def test_bad_models_raise_value_error():
    with pytest.raises(ValueError, match="top_k must be at most n_routed=4"):
        mc.MoEModel(hidden=8, n_layers=1, vocab=10, attention_params=1, n_routed=4, top_k=5, expert_ffn=8)
    with pytest.raises(ValueError, match="dense_ffn"):
        mc.MoEModel(hidden=8, n_layers=2, vocab=10, attention_params=1, n_routed=4, top_k=2, expert_ffn=8,
                    n_dense_layers=1)
    with pytest.raises(ValueError, match="n_heads"):
        mc.gqa_attention_params(8, 0, 1, 4)
