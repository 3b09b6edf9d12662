"""utils.kernels.split_kv_decode: split-KV (Flash-Decoding) attention against the PyTorch paged reference."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from utils.attention import PagedKVCache
from utils.attention.paged_attention import contiguous_attention, paged_attention
from utils.device import INTERPRETER, device, manual_seed
from utils.kernels.paged_attention import block_tables_tensor, paged_decode
from utils.kernels.split_kv_decode import choose_num_splits, merge_partials, split_kv_attention, split_kv_decode

TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3)}


def _cache(lengths, dtype=torch.float32, n_kv_heads=2, head_dim=16, block_size=4, num_blocks=64):
    manual_seed(0)
    cache = PagedKVCache(num_blocks, block_size, n_kv_heads, head_dim, dtype=dtype, device=device())
    seqs = [cache.add_sequence() for _ in lengths]
    for step in range(max(lengths)):  # one token at a time, round-robin: each sequence's blocks are scattered
        for seq, n in zip(seqs, lengths):
            if step < n:
                cache.append(seq, *(torch.randn(1, n_kv_heads, head_dim, device=device()).to(dtype) for _ in range(2)))
    return cache, seqs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n_heads,num_splits", [(2, 3), (8, 4), (6, 1)])
def test_equals_the_paged_reference_for_mixed_lengths(dtype, n_heads, num_splits):
    cache, seqs = _cache([1, 5, 37, 70], dtype)  # some splits of the short sequences are empty
    q = torch.randn(len(seqs), n_heads, 16, device=device()).to(dtype)
    out = split_kv_attention(q, cache, seqs, num_splits=num_splits)
    assert out.dtype == dtype and out.shape == q.shape
    want = paged_attention(q.float(), cache, seqs)  # the PyTorch loop over blocks, in fp32
    torch.testing.assert_close(out.float(), want, **TOLERANCE[dtype])


def test_equals_the_unsplit_kernel_and_contiguous_attention_with_a_non_default_scale():
    cache, seqs = _cache([50, 9], block_size=8)
    q = torch.randn(2, 4, 16, device=device())
    tables, lengths = block_tables_tensor(cache, seqs)
    out = split_kv_decode(q, cache.k_blocks, cache.v_blocks, tables, lengths, num_splits=3, sm_scale=0.3)
    torch.testing.assert_close(out, paged_decode(q, cache.k_blocks, cache.v_blocks, tables, lengths, 0.3),
                               **TOLERANCE[torch.float32])
    for row, seq in enumerate(seqs):
        torch.testing.assert_close(out[row], contiguous_attention(q[row], *cache.gather(seq), scale=0.3),
                                   **TOLERANCE[torch.float32])


def test_partials_are_each_chunks_softmax_and_merge_by_log_sum_exp():
    cache, seqs = _cache([40], n_kv_heads=1, block_size=8)
    q = torch.randn(1, 2, 16, device=device())
    tables, lengths = block_tables_tensor(cache, seqs)
    out, o_part, lse = split_kv_decode(q, cache.k_blocks, cache.v_blocks, tables, lengths, num_splits=3,
                                       block_n=16, return_partials=True)
    k, v = cache.gather(seqs[0])                      # (40, 1, 16)
    scores = (q[0] @ k[:, 0].T) / math.sqrt(16)       # (2 heads, 40)
    for i, (a, b) in enumerate([(0, 16), (16, 32), (32, 40)]):  # chunks of ceil(ceil(40 / 3) / 16) * 16 tokens
        torch.testing.assert_close(lse[0, :, i], torch.logsumexp(scores[:, a:b], dim=-1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(o_part[0, :, i], scores[:, a:b].softmax(-1) @ v[a:b, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(merge_partials(o_part, lse), out, rtol=1e-5, atol=1e-5)


def test_merge_ignores_empty_splits():
    o_part = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    lse = torch.tensor([0.5, -math.inf])
    assert torch.equal(merge_partials(o_part, lse), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="lse's shape"):
        merge_partials(o_part, lse[:1])


def test_choose_num_splits_fills_the_sms():
    # one 32K-token sequence, 8 KV heads, an H100's 132 SMs with 2 programs each: 264 slots / 8 = 33 splits
    assert choose_num_splits(1, 8, 32768, 132, 16) == 33
    assert choose_num_splits(64, 8, 4096, 132, 16) == 1          # 512 programs already fill 264 slots
    assert choose_num_splits(1, 8, 1000, 132, 16) == 7           # no chunk under 128 tokens: 63 blocks // 8
    assert choose_num_splits(1, 8, 100, 132, 16) == 1
    assert choose_num_splits(2, 2, 4096, 8, 16, programs_per_sm=1) == 2
    for batch, kv, n, sms in ((1, 8, 32768, 132), (3, 2, 9000, 108), (1, 1, 10**6, 132)):
        splits = choose_num_splits(batch, kv, n, sms)
        assert batch * kv * splits <= 2 * sms                     # one wave at most
        assert math.ceil(n / splits) >= 128 or splits == 1
    with pytest.raises(ValueError, match="n_sms must be a positive integer"):
        choose_num_splits(1, 8, 100, 0)


def test_bad_inputs_are_refused():
    cache, seqs = _cache([5])
    tables, lengths = block_tables_tensor(cache, seqs)
    q = torch.randn(1, 4, 16, device=device())
    with pytest.raises(ValueError, match="num_splits must be"):
        split_kv_decode(q, cache.k_blocks, cache.v_blocks, tables, lengths, num_splits=0)
    with pytest.raises(ValueError, match="multiple of the cache's 2 KV heads"):
        split_kv_decode(q[:, :3], cache.k_blocks, cache.v_blocks, tables, lengths, num_splits=2)
    with pytest.raises(ValueError, match="block_n must be a power of two"):
        split_kv_decode(q, cache.k_blocks, cache.v_blocks, tables, lengths, num_splits=2, block_n=24)
    with pytest.raises(ValueError, match="must match the cache"):
        split_kv_decode(q.half(), cache.k_blocks, cache.v_blocks, tables, lengths, num_splits=2)
    with pytest.raises(ValueError, match="q must have shape"):
        split_kv_attention(q[0], cache, seqs)


@settings(max_examples=12, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=3), num_splits=st.integers(1, 6),
       block_size=st.sampled_from([2, 4, 8]), group=st.sampled_from([1, 3, 4]))
def test_any_lengths_splits_block_sizes_and_groups(lengths, num_splits, block_size, group):
    cache, seqs = _cache(lengths, block_size=block_size, num_blocks=3 * 40)
    q = torch.randn(len(seqs), 2 * group, 16, device=device())
    torch.testing.assert_close(split_kv_attention(q, cache, seqs, num_splits=num_splits),
                               paged_attention(q, cache, seqs), **TOLERANCE[torch.float32])


@pytest.mark.skipif(not INTERPRETER, reason="bf16 is refused only under the interpreter")
def test_bf16_is_refused_under_the_interpreter():
    cache, seqs = _cache([5])
    with pytest.raises(ValueError, match="bfloat16"):
        split_kv_attention(torch.zeros(1, 2, 16, dtype=torch.bfloat16), cache, seqs, num_splits=2)
