import pytest

from utils.serving.runtime.block_pool import BlockPool
from utils.serving.runtime.prefix_hash import block_hashes


def test_allocate_and_free_count_references():
    pool = BlockPool(4)
    a = pool.allocate(3)
    assert pool.num_free_blocks == 1 and all(pool.refcount(b) == 1 for b in a)
    pool.free(a)
    assert pool.num_free_blocks == 4
    with pytest.raises(ValueError, match="not held"):
        pool.free([a[0]])
    with pytest.raises(ValueError, match="cannot allocate 5"):
        pool.allocate(5)


def test_prefix_hits_share_blocks_and_survive_free_until_evicted():
    pool = BlockPool(4, prefix_caching=True)
    hashes = block_hashes(list(range(8)), 4)
    blocks = pool.allocate(2)
    for b, h in zip(blocks, hashes):
        pool.register(b, h)
    assert pool.lookup(hashes) == blocks  # a second request shares both
    assert [pool.refcount(b) for b in blocks] == [2, 2]
    pool.free(blocks)
    pool.free(blocks)
    assert pool.num_free_blocks == 4 and pool.num_cached_blocks == 2
    assert pool.lookup(hashes[:1]) == blocks[:1]  # still a hit after free
    assert pool.num_free_blocks == 3
    pool.allocate(3)  # takes the two never-used blocks first, then the cached tail
    assert pool.evictions == 1
    assert pool.lookup(hashes) == blocks[:1]


def test_lru_evicts_least_recently_freed_and_tail_first():
    pool = BlockPool(4, prefix_caching=True)
    first, second = pool.allocate(2), pool.allocate(2)
    hs = block_hashes(list(range(16)), 4)
    for b, h in zip(first + second, hs):
        pool.register(b, h)
    pool.free(first)   # queue: first[1], first[0]
    pool.free(second)  # then second[1], second[0]
    assert pool.allocate(1) == [first[1]]
    assert pool.lookup(hs[:2]) == [first[0]]


def test_no_caching_means_no_hits():
    pool = BlockPool(2)
    b = pool.allocate(1)
    pool.register(b[0], 123)
    assert pool.lookup([123]) == []
