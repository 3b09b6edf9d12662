import pytest
import torch

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.serving.hf_bridge import hf_state_dict, to_hf_llama


@pytest.mark.parametrize("layout", ["interleaved", "neox"])
def test_hf_llama_has_the_same_logits_and_greedy_tokens(layout):
    torch.manual_seed(0)
    model = TinyLlama(LlamaConfig(vocab=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, rope_layout=layout)).eval()
    hf = to_hf_llama(model)
    tokens = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens), atol=1e-5, rtol=1e-5)
    out = hf.generate(tokens[:1], max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert out.tolist() == model.generate(tokens[:1], 6).tolist()


def test_state_dict_is_detached_copy():
    model = TinyLlama(LlamaConfig(vocab=16, dim=16, n_layers=1, n_heads=2, n_kv_heads=1))
    state = hf_state_dict(model)
    assert len(state) == 3 + 9
    assert all(not t.requires_grad for t in state.values())
    state["model.norm.weight"].add_(1.0)
    assert torch.equal(model.norm, torch.ones(16))


def test_rejects_other_models():
    with pytest.raises(ValueError, match="TinyLlama"):
        to_hf_llama(torch.nn.Linear(2, 2))
