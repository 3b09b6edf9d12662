"""utils.attention.rope: the two RoPE layouts are one rotation after a permutation; HF's weight permutation keeps scores."""

import dataclasses

import pytest
import torch

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.attention.rope import apply_rope, neox_permutation, permute_rows_to_neox, rope_angles, rope_frequencies


def hf_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Hugging Face's convert_llama_weights_to_hf.py, ``permute`` ("permute for sliced rotary"), as published."""
    dim1, dim2 = w.shape
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


def hf_rope(x, cos, sin):
    """Hugging Face's LLaMA: ``x * cos + rotate_half(x) * sin`` with cos, sin repeated over both halves."""
    half = x.shape[-1] // 2
    rotate_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * torch.cat((cos, cos), -1) + rotate_half * torch.cat((sin, sin), -1)


def meta_rope(x, cos, sin):
    """Meta's model.py: pair (x_2i, x_2i+1) as a complex number times e^{i m theta}."""
    z = torch.view_as_complex(x.double().unflatten(-1, (-1, 2)).contiguous())
    return torch.view_as_real(z * torch.complex(cos.double(), sin.double())).flatten(-2).to(x.dtype)


def test_frequencies_are_base_to_the_minus_2i_over_d():
    theta = rope_frequencies(128, 10000.0)
    assert theta[0] == 1 and theta[1] == pytest.approx(10000 ** (-2 / 128))
    assert float(2 * torch.pi / theta[-1]) == pytest.approx(54410, rel=1e-3)   # the chapter's "one turn per 54,000 tokens"


def test_each_layout_matches_its_published_form():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 11, 16)
    cos, sin = rope_angles(11, 16, start=5)
    torch.testing.assert_close(apply_rope(x, cos, sin, "neox"), hf_rope(x, cos, sin))
    torch.testing.assert_close(apply_rope(x, cos, sin, "interleaved"), meta_rope(x, cos, sin))
    torch.testing.assert_close(apply_rope(x, cos, sin), apply_rope(x, cos, sin, "interleaved"))


@pytest.mark.parametrize("head_dim", [2, 8, 128])
def test_the_permutation_is_hf_permute_and_maps_one_layout_to_the_other(head_dim):
    perm = neox_permutation(head_dim)
    rows = torch.arange(head_dim, dtype=torch.float32).view(-1, 1)
    assert perm.tolist() == hf_permute(rows, 1).flatten().long().tolist()
    torch.manual_seed(0)
    x = torch.randn(4, 9, head_dim)
    cos, sin = rope_angles(9, head_dim)
    torch.testing.assert_close(apply_rope(x[..., perm], cos, sin, "neox"), apply_rope(x, cos, sin)[..., perm])
    w = torch.randn(3 * head_dim, 5)
    torch.testing.assert_close(permute_rows_to_neox(w, 3), hf_permute(w, 3))


def test_scores_are_equal_after_permuting_wq_and_wk():
    torch.manual_seed(0)
    n_heads, head_dim, dim, seq = 4, 16, 32, 10
    wq, wk, x = torch.randn(n_heads * head_dim, dim), torch.randn(n_heads * head_dim, dim), torch.randn(seq, dim)
    cos, sin = rope_angles(seq, head_dim)

    def scores(wq, wk, layout):
        q = (x @ wq.T).view(seq, n_heads, head_dim).transpose(0, 1)
        k = (x @ wk.T).view(seq, n_heads, head_dim).transpose(0, 1)
        return apply_rope(q, cos, sin, layout) @ apply_rope(k, cos, sin, layout).transpose(-2, -1)

    meta = scores(wq, wk, "interleaved")
    hf_wq, hf_wk = permute_rows_to_neox(wq, n_heads), permute_rows_to_neox(wk, n_heads)
    torch.testing.assert_close(scores(hf_wq, hf_wk, "neox"), meta, rtol=1e-4, atol=1e-4)
    wrong = scores(hf_wq, hf_wk, "interleaved")            # the book's RoPE on HF-layout weights
    assert (wrong - meta).abs().max() > 1.0


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_a_converted_model_gives_the_same_logits_only_under_its_layout(n_kv_heads):
    torch.manual_seed(0)
    config = LlamaConfig(n_heads=4, n_kv_heads=n_kv_heads)
    meta = TinyLlama(config).eval()
    hf = TinyLlama(dataclasses.replace(config, rope_layout="neox")).eval()
    state = meta.state_dict()
    for i in range(config.n_layers):
        state[f"blocks.{i}.attn.wq.weight"] = permute_rows_to_neox(state[f"blocks.{i}.attn.wq.weight"], config.n_heads)
        state[f"blocks.{i}.attn.wk.weight"] = permute_rows_to_neox(state[f"blocks.{i}.attn.wk.weight"], n_kv_heads)
    hf.load_state_dict(state)
    tokens = torch.randint(0, config.vocab, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens), meta(tokens), rtol=1e-4, atol=1e-4)
        wrong = TinyLlama(config).eval()
        wrong.load_state_dict(state)                       # HF weights under the interleaved layout
        assert (wrong(tokens) - meta(tokens)).abs().max() > 1e-2
        torch.testing.assert_close(wrong(tokens[:, :1]), meta(tokens[:, :1]))   # position 0 is not rotated


def test_bad_input_raises():
    with pytest.raises(ValueError, match="layout must be one of"):
        apply_rope(torch.randn(2, 4), *rope_angles(2, 4), layout="gptj")
    with pytest.raises(ValueError, match="layout must be one of"):
        LlamaConfig(rope_layout="half")
    with pytest.raises(ValueError, match="even"):
        neox_permutation(5)
    with pytest.raises(ValueError, match="multiple of n_heads"):
        permute_rows_to_neox(torch.randn(10, 4), 3)
    with pytest.raises(ValueError, match="inv_freq must have shape"):
        rope_angles(3, 8, inv_freq=torch.ones(3))


def test_angles_start_at_the_given_position():
    # head_dim 4, base 100: theta = (1, 100^(-2/4)) = (1, 0.1). Positions 3 and 4 (a decode step after a 3-token
    # prompt) rotate by (3, 0.3) and (4, 0.4) radians; counting from 0 would give (0, 0) and (1, 0.1).
    cos, sin = rope_angles(2, 4, base=100.0, start=3)
    angles = torch.tensor([[3.0, 0.3], [4.0, 0.4]], dtype=torch.float64)
    torch.testing.assert_close(cos, angles.cos().float())
    torch.testing.assert_close(sin, angles.sin().float())
