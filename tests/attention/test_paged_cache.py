import pytest
import torch

from utils.attention import OutOfBlocksError, PagedKVCache

H, D = 2, 4


def _tokens(n, start=0):
    k = torch.arange(start, start + n, dtype=torch.float32)[:, None, None].expand(n, H, D).clone()
    return k, -k


def test_gather_returns_what_was_appended_across_blocks():
    cache = PagedKVCache(num_blocks=8, block_size=4, n_kv_heads=H, head_dim=D)
    seq = cache.add_sequence()
    for start, n in ((0, 3), (3, 1), (4, 6)):
        cache.append(seq, *_tokens(n, start))
    k, v = cache.gather(seq)
    expected_k, expected_v = _tokens(10)
    torch.testing.assert_close(k, expected_k)
    torch.testing.assert_close(v, expected_v)
    assert len(cache.block_table(seq)) == 3 and cache.num_free_blocks == 5


def test_fork_shares_every_block_and_copies_nothing():
    cache = PagedKVCache(num_blocks=8, block_size=4, n_kv_heads=H, head_dim=D)
    parent = cache.add_sequence()
    cache.append(parent, *_tokens(6))
    free_before = cache.num_free_blocks
    child = cache.fork(parent)
    assert cache.block_table(child) == cache.block_table(parent)
    assert cache.num_free_blocks == free_before and cache.copies == 0
    assert all(cache.refcount(b) == 2 for b in cache.block_table(parent))


def test_writing_into_a_shared_block_copies_it_first():
    cache = PagedKVCache(num_blocks=8, block_size=4, n_kv_heads=H, head_dim=D)
    parent = cache.add_sequence()
    cache.append(parent, *_tokens(6))  # blocks: [full, half-full]
    child = cache.fork(parent)
    cache.append(child, *_tokens(1, start=100))
    parent_table, child_table = cache.block_table(parent), cache.block_table(child)
    assert parent_table[0] == child_table[0] and parent_table[1] != child_table[1]
    assert cache.copies == 1
    torch.testing.assert_close(cache.gather(parent)[0], _tokens(6)[0])  # the parent is untouched
    torch.testing.assert_close(cache.gather(child)[0], torch.cat([_tokens(6)[0], _tokens(1, 100)[0]]))
    cache.append(parent, *_tokens(1, start=200))  # the parent now owns its tail alone: no copy
    assert cache.copies == 1


def test_a_full_shared_tail_needs_no_copy():
    cache = PagedKVCache(num_blocks=8, block_size=4, n_kv_heads=H, head_dim=D)
    parent = cache.add_sequence()
    cache.append(parent, *_tokens(4))
    child = cache.fork(parent)
    cache.append(child, *_tokens(2, 4))
    assert cache.copies == 0 and cache.block_table(child)[0] == cache.block_table(parent)[0]


def test_free_returns_blocks_only_when_no_sequence_uses_them():
    cache = PagedKVCache(num_blocks=4, block_size=2, n_kv_heads=H, head_dim=D)
    parent = cache.add_sequence()
    cache.append(parent, *_tokens(4))
    child = cache.fork(parent)
    cache.free(parent)
    assert cache.num_free_blocks == 2
    cache.free(child)
    assert cache.num_free_blocks == 4
    with pytest.raises(ValueError, match="no sequence"):
        cache.gather(child)


def test_running_out_of_blocks_says_so_and_loses_nothing():
    cache = PagedKVCache(num_blocks=2, block_size=2, n_kv_heads=H, head_dim=D)
    seq = cache.add_sequence()
    cache.append(seq, *_tokens(3))
    with pytest.raises(OutOfBlocksError, match="needs 1 free blocks, but only 0"):
        cache.append(seq, *_tokens(2, 3))
    assert cache.length(seq) == 3
    torch.testing.assert_close(cache.gather(seq)[0], _tokens(3)[0])
    cache.append(seq, *_tokens(1, 3))  # the last free slot still works
    assert cache.length(seq) == 4


@pytest.mark.parametrize("k_shape, v_shape", [((3, H, D + 1), (3, H, D + 1)), ((3, H, D), (2, H, D)), ((H, D), (H, D))])
def test_wrong_shapes_raise(k_shape, v_shape):
    cache = PagedKVCache(num_blocks=2, block_size=2, n_kv_heads=H, head_dim=D)
    seq = cache.add_sequence()
    with pytest.raises(ValueError, match="must both have shape"):
        cache.append(seq, torch.zeros(k_shape), torch.zeros(v_shape))


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="block_size"):
        PagedKVCache(num_blocks=2, block_size=0, n_kv_heads=H, head_dim=D)


def test_to_copies_blocks_and_bookkeeping_independently():
    cache = PagedKVCache(num_blocks=8, block_size=4, n_kv_heads=1, head_dim=2)
    seq = cache.add_sequence()
    cache.append(seq, torch.randn(6, 1, 2), torch.randn(6, 1, 2))
    moved = cache.to("cpu")
    assert moved.k_blocks is not cache.k_blocks and moved.block_table(seq) == cache.block_table(seq)
    torch.testing.assert_close(moved.gather(seq)[0], cache.gather(seq)[0])
    moved.append(seq, torch.randn(3, 1, 2), torch.randn(3, 1, 2))  # the copy grows, the original does not
    assert (moved.length(seq), cache.length(seq)) == (9, 6)
    assert moved.num_free_blocks == cache.num_free_blocks - 1


def test_interleaved_cache_scatters_each_sequence_and_keeps_its_tokens():
    from utils.attention.paged_cache import interleaved_cache

    k, v = torch.randn(3, 10, 2, 4), torch.randn(3, 10, 2, 4)
    cache, seqs = interleaved_cache(k, v, block_size=4)
    assert [cache.block_table(s) for s in seqs] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    for s, seq in enumerate(seqs):
        got_k, got_v = cache.gather(seq)
        assert torch.equal(got_k, k[s]) and torch.equal(got_v, v[s])
    with pytest.raises(ValueError, match="n_seqs, n_tokens"):
        interleaved_cache(k[0], v[0], 4)


def test_free_slots_are_counted_where_a_wrong_modulo_would_show():
    # block_size 4, both blocks in use: after 5 tokens the last block has 3 free slots ((-5) % 4), not 1 (5 % 4),
    # so 2 more tokens fit; after 7 it has 1, so 3 more need a block there is not. With block_size 2 the right
    # and the wrong count agree at every length, which is why this is checked at 4.
    cache = PagedKVCache(num_blocks=2, block_size=4, n_kv_heads=H, head_dim=D)
    seq = cache.add_sequence()
    cache.append(seq, *_tokens(5))
    assert cache.num_free_blocks == 0
    cache.append(seq, *_tokens(2, 5))  # fits in the last block's free slots
    assert cache.length(seq) == 7
    with pytest.raises(OutOfBlocksError, match="needs 1 free blocks, but only 0"):
        cache.append(seq, *_tokens(3, 7))  # 1 slot left: the other 2 need a block
    assert cache.length(seq) == 7
    cache.append(seq, *_tokens(1, 7))
    torch.testing.assert_close(cache.gather(seq)[0], torch.cat([_tokens(5)[0], _tokens(2, 5)[0], _tokens(1, 7)[0]]))
