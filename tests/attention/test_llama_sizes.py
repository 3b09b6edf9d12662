"""utils.attention.llama_sizes: the closed form against a model built on the meta device and against LLaMA's Table 2."""

import pytest
import torch

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.attention.llama_sizes import LLAMA_1, LLAMA_VOCAB, llama_param_breakdown, llama_param_count


def _built(config: LlamaConfig) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in TinyLlama(config).parameters())


@pytest.mark.parametrize("sizes", [dict(vocab=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=4),
                                   dict(vocab=100, dim=96, n_layers=3, n_heads=6, n_kv_heads=2, ffn_hidden=200),
                                   dict(vocab=7, dim=32, n_layers=1, n_heads=4, n_kv_heads=1)])
def test_formula_counts_the_parameters_of_the_model(sizes):
    config = LlamaConfig(**sizes)
    assert llama_param_count(config.dim, config.n_layers, config.vocab, config.ffn_hidden, config.n_heads,
                             config.n_kv_heads) == _built(config)


@pytest.mark.parametrize("size", LLAMA_1, ids=[s.name for s in LLAMA_1])
def test_llama_1_sizes_match_the_paper(size):
    built = _built(LlamaConfig(vocab=LLAMA_VOCAB, dim=size.dim, n_layers=size.n_layers, n_heads=size.n_heads,
                               n_kv_heads=size.n_heads))
    assert built == llama_param_count(size.dim, size.n_layers, n_heads=size.n_heads)
    # Table 2 prints one decimal in billions (65.29B is printed as 65.2B): within 0.1B
    assert abs(built - size.params.value) < 0.1e9


def test_llama_7b_breakdown():
    parts = llama_param_breakdown(4096, 32, n_heads=32)
    assert parts["ffn"] == 32 * 3 * 4096 * 11008  # config.json intermediate_size 11008
    assert parts["attention"] == 32 * 4 * 4096**2
    assert sum(parts.values()) == 6_738_415_616


def test_bad_input_raises():
    with pytest.raises(ValueError, match="multiple of n_heads"):
        llama_param_count(100, 2, n_heads=3)
    with pytest.raises(ValueError, match="dim"):
        llama_param_count(0, 2)
