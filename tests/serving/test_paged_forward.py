import pytest
import torch

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.serving.paged_forward import KVBlocks, Segment, forward_segments


@pytest.mark.parametrize("layout", ["interleaved", "neox"])
def test_ragged_chunked_batch_equals_one_request_forwards(layout):
    torch.manual_seed(0)
    model = TinyLlama(LlamaConfig(vocab=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                  rope_layout=layout)).double().eval()
    kv = KVBlocks(model, num_blocks=16, block_size=4)
    a, b = torch.randint(0, 64, (10,)).tolist(), torch.randint(0, 64, (7,)).tolist()
    ta, tb = (3, 9, 1), (0, 5)  # scattered blocks
    first = forward_segments(model, kv, [Segment(tuple(a[:6]), 0, ta), Segment(tuple(b), 0, tb)])
    second = forward_segments(model, kv, [Segment(tuple(a[6:]), 6, ta)])
    with torch.no_grad():
        ref_a, ref_b = model(torch.tensor([a]))[0], model(torch.tensor([b]))[0]
    torch.testing.assert_close(first[0], ref_a[5], atol=1e-12, rtol=0)
    torch.testing.assert_close(first[1], ref_b[-1], atol=1e-12, rtol=0)
    torch.testing.assert_close(second[0], ref_a[-1], atol=1e-12, rtol=0)


def test_keys_land_in_their_block_and_slot():
    model = TinyLlama(LlamaConfig(vocab=16, dim=16, n_layers=1, n_heads=2, n_kv_heads=1)).eval()
    kv = KVBlocks(model, num_blocks=4, block_size=2)
    forward_segments(model, kv, [Segment((1, 2, 3), 0, (2, 0))])
    assert kv.slots((2, 0), 0, 3).tolist() == [4, 5, 0]
    assert kv.k[0, 2].abs().sum() > 0 and kv.k[0, 0, 0].abs().sum() > 0
    assert kv.k[0, 0, 1].abs().sum() == 0 and kv.k[0, 1].abs().sum() == 0


def test_segments_must_fit_their_blocks():
    model = TinyLlama(LlamaConfig(vocab=16, dim=16, n_layers=1, n_heads=2, n_kv_heads=1)).eval()
    kv = KVBlocks(model, num_blocks=4, block_size=2)
    with pytest.raises(ValueError, match="does not fit"):
        forward_segments(model, kv, [Segment((1, 2, 3), 0, (0,))])
    with pytest.raises(ValueError, match="at least one"):
        forward_segments(model, kv, [])
