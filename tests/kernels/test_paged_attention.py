"""utils.kernels.paged_attention: the Triton decode kernel against attention over the gathered, contiguous cache."""

import pytest
import torch

from utils.attention import PagedKVCache
from utils.attention.paged_attention import contiguous_attention
from utils.device import device, manual_seed
from utils.kernels.paged_attention import block_tables_tensor, paged_attention_triton

TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3)}


def _cache(lengths, dtype, n_kv_heads=2, head_dim=16, block_size=4):
    manual_seed(0)
    cache = PagedKVCache(64, block_size, n_kv_heads, head_dim, dtype=dtype, device=device())
    seqs = []
    for n in lengths:
        seqs.append(cache.add_sequence())
        cache.append(seqs[-1], torch.randn(n, n_kv_heads, head_dim, device=device()).to(dtype),
                     torch.randn(n, n_kv_heads, head_dim, device=device()).to(dtype))
    return cache, seqs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n_heads", [2, 8])
def test_equals_contiguous_attention_for_different_lengths_and_forks(dtype, n_heads):
    cache, seqs = _cache([1, 4, 5, 11], dtype)
    child = cache.fork(seqs[3])
    cache.append(child, *(torch.randn(3, 2, 16, device=device()).to(dtype) for _ in range(2)))  # copy-on-write
    seqs.append(child)
    q = torch.randn(len(seqs), n_heads, 16, device=device()).to(dtype)
    out = paged_attention_triton(q, cache, seqs)
    assert out.dtype == dtype and out.shape == q.shape
    for row, seq in enumerate(seqs):
        k, v = cache.gather(seq)
        want = contiguous_attention(q[row].double(), k.double(), v.double())
        torch.testing.assert_close(out[row].double(), want, **TOLERANCE[dtype])


def test_block_tables_are_padded_rows_with_their_lengths():
    cache, seqs = _cache([3, 9], torch.float32)
    tables, lengths = block_tables_tensor(cache, seqs)
    assert tables.tolist() == [cache.block_table(seqs[0]) + [0, 0], cache.block_table(seqs[1])]
    assert lengths.tolist() == [3, 9]


def test_non_power_of_two_block_size_is_refused():
    cache, seqs = _cache([3], torch.float32, block_size=3)
    with pytest.raises(ValueError, match="power of two"):
        paged_attention_triton(torch.zeros(1, 2, 16, device=device()), cache, seqs)


def test_paged_decode_from_tensors_equals_the_cache_entry_point():
    from utils.kernels.paged_attention import paged_decode

    manual_seed(0)
    cache = PagedKVCache(num_blocks=12, block_size=4, n_kv_heads=2, head_dim=8, device=device())
    seqs = [cache.add_sequence() for _ in range(3)]
    for n, seq in zip((5, 9, 2), seqs):
        cache.append(seq, torch.randn(n, 2, 8, device=device()), torch.randn(n, 2, 8, device=device()))
    q = torch.randn(3, 4, 8, device=device())
    tables, lengths = block_tables_tensor(cache, seqs)
    torch.testing.assert_close(paged_decode(q, cache.k_blocks, cache.v_blocks, tables, lengths),
                               paged_attention_triton(q, cache, seqs))
    with pytest.raises(ValueError, match="tables must be"):
        paged_decode(q, cache.k_blocks, cache.v_blocks, tables[:2], lengths)
