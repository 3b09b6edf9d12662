import pytest
import torch
from torch import nn

from utils.attention.decode_cost import param_count
from utils.parallel.memory import zero_model_state_bytes
from utils.rl.lora import (PUBLISHED, LoRALinear, apply_lora, count_trainable, finetune_state_bytes,
                           llama_linear_shapes, lora_param_count)


def _base(d_in=12, d_out=10, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(d_in, d_out, bias=bias)


def test_starts_equal_to_the_base_layer():
    base = _base()
    x = torch.randn(5, 12)
    expected = base(x)
    layer = LoRALinear(base, rank=4, alpha=8.0)
    torch.testing.assert_close(layer(x), expected)
    assert torch.count_nonzero(layer.lora_b) == 0 and torch.count_nonzero(layer.lora_a) > 0
    assert layer.lora_a.shape == (4, 12) and layer.lora_b.shape == (10, 4)


def test_only_a_and_b_train():
    layer = LoRALinear(_base(), rank=3)
    trainable = {n for n, p in layer.named_parameters() if p.requires_grad}
    assert trainable == {"lora_a", "lora_b"}
    w0, b0 = layer.base.weight.clone(), layer.base.bias.clone()
    opt = torch.optim.SGD([p for p in layer.parameters() if p.requires_grad], lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        layer(torch.randn(8, 12)).pow(2).sum().backward()
        opt.step()
    assert torch.equal(layer.base.weight, w0) and torch.equal(layer.base.bias, b0)
    assert torch.count_nonzero(layer.lora_b) > 0


def test_forward_is_the_formula_and_merge_gives_the_same_outputs():
    base = _base()
    layer = LoRALinear(base, rank=2, alpha=6.0)
    with torch.no_grad():
        layer.lora_b.normal_()
    x = torch.randn(7, 12)
    by_hand = x @ base.weight.T + base.bias + (6.0 / 2) * x @ (layer.lora_b @ layer.lora_a).T
    torch.testing.assert_close(layer(x), by_hand)
    merged = layer.merge()
    assert isinstance(merged, nn.Linear) and not isinstance(merged, LoRALinear)
    torch.testing.assert_close(merged(x), layer(x).detach())
    torch.testing.assert_close(merged.weight, base.weight + 3.0 * layer.lora_b @ layer.lora_a)


def test_the_update_has_rank_r():
    layer = LoRALinear(_base(32, 24), rank=3)
    with torch.no_grad():
        layer.lora_b.normal_()
    delta = layer.delta_weight().detach()  # float32: rounding leaves singular values near 1e-7 of the largest
    singular = torch.linalg.svdvals(delta)
    assert torch.linalg.matrix_rank(delta).item() == 3
    assert (singular[:3] > 1e-3 * singular[0]).all() and (singular[3:] < 1e-5 * singular[0]).all()


class _Block(nn.Module):
    def __init__(self, d=16, kv=8):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d, bias=False), nn.Linear(d, kv, bias=False),
                                                              nn.Linear(d, kv, bias=False), nn.Linear(d, d, bias=False))
        self.norm = nn.LayerNorm(d)


def test_apply_lora_replaces_the_targets_and_counts_parameters():
    torch.manual_seed(0)
    model = nn.Sequential(_Block(), _Block())
    x = torch.randn(3, 16)
    q_before = model[0].q_proj(x)
    apply_lora(model, rank=2, targets=("q_proj", "v_proj"))
    assert isinstance(model[0].q_proj, LoRALinear) and isinstance(model[1].v_proj, LoRALinear)
    assert isinstance(model[0].k_proj, nn.Linear) and not isinstance(model[0].k_proj, LoRALinear)
    torch.testing.assert_close(model[0].q_proj(x), q_before)
    # per block: q (16 -> 16) r (16 + 16) = 64, v (16 -> 8) r (16 + 8) = 48; two blocks; LayerNorm frozen
    assert count_trainable(model) == 2 * (2 * 32 + 2 * 24) == 224
    assert lora_param_count([(16, 16), (16, 8)] * 2, rank=2) == 224


def test_llama_7b_q_v_rank_8_is_peft_s_count():
    """PEFT's print_trainable_parameters for LLaMA-2-7B, r=8 on q_proj and v_proj: 4,194,304 trainable."""
    shapes = llama_linear_shapes(4096, 32, 11008, n_heads=32, targets=("q_proj", "v_proj"))
    assert lora_param_count(shapes, 8) == 4_194_304


def test_gpt3_figures_of_the_lora_paper():
    """GPT-3 175B (96 layers, d_model 12288), r = 4 on W_q and W_v: about 10,000x fewer trainable parameters."""
    n_lora = lora_param_count([(12288, 12288)] * 2 * 96, rank=4)
    ratio = 175e9 / n_lora
    assert ratio == pytest.approx(PUBLISHED["gpt3_trainable_reduction"].value, rel=0.1)


def test_gpt3_vram_of_section_4_2_is_our_lora_count_against_a_smaller_baseline():
    """LoRA section 4.2: 1.2 TB -> 350 GB. The LoRA side is our count (175B fp16 weights, 2 bytes each);
    the full fine-tuning side is about 6.9 bytes per parameter, not mixed-precision Adam's 16."""
    n, n_lora = 175e9, lora_param_count([(12288, 12288)] * 2 * 96, rank=4)
    assert finetune_state_bytes(n, n_lora) == pytest.approx(PUBLISHED["gpt3_lora_vram_bytes"].value, rel=0.01)
    assert PUBLISHED["gpt3_full_vram_bytes"].value / n == pytest.approx(6.9, abs=0.05)
    assert finetune_state_bytes(0, n) / n == 16
    assert PUBLISHED["gpt3_full_vram_bytes"].value / PUBLISHED["gpt3_lora_vram_bytes"].value == pytest.approx(
        PUBLISHED["gpt3_memory_reduction"].value, rel=0.15)


def test_finetune_bytes_reuse_the_zero_calculator():
    n = param_count("LLaMA-2-7B")
    assert finetune_state_bytes(0, n) == zero_model_state_bytes(n, 1, 0)
    assert finetune_state_bytes(n, 4_194_304) == pytest.approx(2 * n + 16 * 4_194_304)


@pytest.mark.parametrize("kwargs", [dict(rank=0), dict(rank=2.5), dict(rank=11), dict(rank=2, alpha=0.0)])
def test_bad_input_raises(kwargs):
    with pytest.raises(ValueError):
        LoRALinear(_base(), **kwargs)


def test_apply_lora_with_no_match_raises():
    with pytest.raises(ValueError, match="no nn.Linear"):
        apply_lora(nn.Sequential(_Block()), rank=2, targets=("c_attn",))
    with pytest.raises(ValueError):
        apply_lora(nn.Sequential(_Block()), rank=2, targets="q_proj")
    with pytest.raises(ValueError):
        LoRALinear(nn.Conv1d(2, 2, 1), rank=1)
