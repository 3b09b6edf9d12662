import pytest
import torch
import torch.nn.functional as F

from utils.attention import PagedKVCache
from utils.attention.paged_attention import contiguous_attention, paged_attention


def _filled_cache(lengths, n_kv_heads=2, head_dim=8, block_size=4, num_blocks=32, seed=0):
    torch.manual_seed(seed)
    cache = PagedKVCache(num_blocks, block_size, n_kv_heads, head_dim)
    seqs = []
    for n in lengths:
        seq = cache.add_sequence()
        cache.append(seq, torch.randn(n, n_kv_heads, head_dim), torch.randn(n, n_kv_heads, head_dim))
        seqs.append(seq)
    return cache, seqs


def test_contiguous_reference_equals_torch_sdpa():
    torch.manual_seed(1)
    q, k, v = torch.randn(4, 8), torch.randn(7, 4, 8), torch.randn(7, 4, 8)
    expected = F.scaled_dot_product_attention(q[:, None, :], k.transpose(0, 1), v.transpose(0, 1))[:, 0]
    torch.testing.assert_close(contiguous_attention(q, k, v), expected)


@pytest.mark.parametrize("n_heads", [2, 4, 8])  # MHA and two GQA group sizes over 2 KV heads
def test_paged_equals_contiguous_for_sequences_of_different_lengths(n_heads):
    lengths = [1, 3, 4, 5, 9, 16, 17]  # inside one block, exactly full blocks, one slot into a new block
    cache, seqs = _filled_cache(lengths)
    q = torch.randn(len(seqs), n_heads, 8)
    out = paged_attention(q, cache, seqs)
    for row, seq in enumerate(seqs):
        torch.testing.assert_close(out[row], contiguous_attention(q[row], *cache.gather(seq)))


def test_forked_sequences_after_divergence():
    cache, (parent,) = _filled_cache([6])
    child = cache.fork(parent)
    cache.append(child, torch.randn(3, 2, 8), torch.randn(3, 2, 8))  # copy-on-write of the shared tail
    cache.append(parent, torch.randn(1, 2, 8), torch.randn(1, 2, 8))
    assert cache.copies == 1 and cache.block_table(parent)[0] == cache.block_table(child)[0]
    q = torch.randn(2, 4, 8)
    out = paged_attention(q, cache, [parent, child])
    for row, seq in enumerate([parent, child]):
        torch.testing.assert_close(out[row], contiguous_attention(q[row], *cache.gather(seq)))
    assert not torch.allclose(out[0], out[1])


def test_scattered_blocks_are_read_in_table_order():
    """Free a sequence in the middle so that the next one gets blocks out of order in the pool."""
    cache, (a, b, c) = _filled_cache([8, 8, 8])
    cache.free(b)
    d = cache.add_sequence()
    cache.append(d, torch.randn(12, 2, 8), torch.randn(12, 2, 8))
    assert cache.block_table(d) != sorted(cache.block_table(d))
    q = torch.randn(1, 2, 8)
    torch.testing.assert_close(paged_attention(q, cache, [d])[0], contiguous_attention(q[0], *cache.gather(d)))


def test_half_precision_cache():
    torch.manual_seed(2)
    cache = PagedKVCache(8, 4, 2, 8, dtype=torch.float16)
    seq = cache.add_sequence()
    cache.append(seq, torch.randn(10, 2, 8).half(), torch.randn(10, 2, 8).half())
    q = torch.randn(1, 2, 8).half()
    k, v = cache.gather(seq)
    expected = contiguous_attention(q[0].float(), k.float(), v.float()).half()
    torch.testing.assert_close(paged_attention(q, cache, [seq])[0], expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("q_shape, ids, match", [
    ((1, 3, 8), [0], "multiple of the number of KV heads"),
    ((1, 2, 7), [0], "must have shape"),
    ((2, 2, 8), [0], "one query per sequence"),
])
def test_bad_input_raises(q_shape, ids, match):
    cache, _ = _filled_cache([3])
    with pytest.raises(ValueError, match=match):
        paged_attention(torch.zeros(q_shape), cache, ids)


def test_an_empty_sequence_raises():
    cache = PagedKVCache(4, 4, 2, 8)
    seq = cache.add_sequence()
    with pytest.raises(ValueError, match="no cached tokens"):
        paged_attention(torch.zeros(1, 2, 8), cache, [seq])
