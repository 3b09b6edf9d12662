import pytest
import torch

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.serving.runtime.paged_forward import KVBlocks, Segment, forward_segments


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


def _float_and_quantised_caches(kv_format):
    torch.manual_seed(3)
    model = TinyLlama(LlamaConfig(vocab=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2)).eval()
    prompt = tuple(torch.randint(0, 64, (9,)).tolist())
    runs = []
    for fmt in (None, kv_format):
        kv = KVBlocks(model, num_blocks=8, block_size=4, kv_format=fmt)
        runs.append((kv, forward_segments(model, kv, [Segment(prompt, 0, (5, 1, 6))])))
    return model, runs


@pytest.mark.parametrize("kv_format", ["int8", "fp8_e4m3"])
def test_quantised_cache_stores_the_first_layers_keys_quantised_on_write(kv_format):
    from utils.serving.quantisation.quant import dequantize_kv, quantize_kv
    model, ((ref_kv, ref_logits), (kv, logits)) = _float_and_quantised_caches(kv_format)
    assert kv.k.dtype == {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}[kv_format]
    slots = kv.slots((5, 1, 6), 0, 9)
    # layer 0's keys do not depend on the cache, so the stored ones are exactly the float ones, quantised
    want = ref_kv.k[0].flatten(0, 1)[slots]
    scale = None if kv_format == "int8" else 1.0
    torch.testing.assert_close(kv.read(0, slots, torch.float32)[0], dequantize_kv(*quantize_kv(want, kv_format, scale)))
    assert (logits - ref_logits).abs().max() < 0.05 * ref_logits.abs().max()
    assert not torch.equal(logits, ref_logits)


def test_quantised_cache_bytes():
    model = TinyLlama(LlamaConfig(vocab=16, dim=32, n_layers=2, n_heads=4, n_kv_heads=2)).eval()
    elements = 2 * 2 * 6 * 4 * 2 * 8  # K and V, layers, blocks, block size, kv heads, head_dim
    assert KVBlocks(model, 6, 4).nbytes == 4 * elements
    assert KVBlocks(model, 6, 4, kv_format="fp8_e4m3").nbytes == elements
    assert KVBlocks(model, 6, 4, kv_format="int8").nbytes == elements + 4 * elements // 8  # a scale per vector
    assert KVBlocks(model, 6, 4, kv_format="int8").bytes_per_block * 6 == elements * 3 // 2
    with pytest.raises(ValueError, match="kv_format"):
        KVBlocks(model, 6, 4, kv_format="int4")
    with pytest.raises(ValueError, match="not both"):
        KVBlocks(model, 6, 4, dtype=torch.float16, kv_format="int8")


def test_a_quantised_cache_refuses_the_batched_decode_path():
    model = TinyLlama(LlamaConfig(vocab=16, dim=16, n_layers=1, n_heads=2, n_kv_heads=1)).eval()
    kv = KVBlocks(model, num_blocks=4, block_size=2, kv_format="int8")
    with pytest.raises(ValueError, match="decode_attention='loop'"):
        forward_segments(model, kv, [Segment((1,), 0, (0,))], decode_attention="batched")


def test_each_norm_keeps_its_own_gain():
    # TinyLlama starts with every RMSNorm gain at 1, where a forward that used one norm's gain for another
    # could not show; with distinct random gains the paged forward must still equal the model's own.
    torch.manual_seed(0)
    model = TinyLlama(LlamaConfig(vocab=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2)).double().eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn_norm.uniform_(0.5, 1.5)
            block.ffn_norm.uniform_(0.5, 1.5)
        model.norm.uniform_(0.5, 1.5)
    tokens = torch.randint(0, 64, (7,)).tolist()
    logits = forward_segments(model, KVBlocks(model, num_blocks=4, block_size=4), [Segment(tuple(tokens), 0, (2, 0))])
    with torch.no_grad():
        reference = model(torch.tensor([tokens]))[0, -1]
    torch.testing.assert_close(logits[0], reference, atol=1e-12, rtol=0)
