import pytest
import torch

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.serving.runtime.hf_bridge import hf_state_dict, to_hf_llama


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


def test_transformers_continuous_batching_matches_the_book_engine():
    from utils.serving.runtime.engine import Engine
    from utils.serving.runtime.hf_bridge import hf_continuous_batching

    torch.manual_seed(0)
    model = TinyLlama(LlamaConfig(vocab=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2)).double().eval()
    g = torch.Generator().manual_seed(1)
    requests = [(torch.randint(0, 64, (int(n),), generator=g).tolist(), int(m))
                for n, m in zip(torch.randint(2, 30, (6,), generator=g), torch.randint(2, 9, (6,), generator=g))]
    engine = Engine(model, num_blocks=32, block_size=8, max_num_batched_tokens=32)
    ids = [engine.add_request(p, n) for p, n in requests]
    ours = engine.run()
    theirs = hf_continuous_batching(to_hf_llama(model), requests, page_size=8, num_blocks=32, max_batch_tokens=32)
    assert theirs == [ours[i] for i in ids]
