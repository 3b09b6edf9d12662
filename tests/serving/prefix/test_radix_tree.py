"""The radix tree: longest-prefix matches, edge splits, locks, LRU eviction of leaves, counters."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from utils.serving.prefix.radix_tree import RadixTree
from tests.serving.prefix_reference import lcp


def test_match_is_the_longest_common_prefix_and_splits_the_edge():
    tree = RadixTree()
    assert tree.insert([1, 2, 3, 4]) == 0
    assert tree.match_prefix([1, 2, 9]) == 2
    # the edge [1, 2, 3, 4] was cut after two tokens: [1, 2] -> [3, 4]
    assert sorted(n.tokens for n in tree.nodes()) == [(1, 2), (3, 4)]
    assert tree.splits == 1
    assert tree.insert([1, 2, 5]) == 2
    assert sorted(tree.sequences()) == [(1, 2, 3, 4), (1, 2, 5)]
    assert tree.total_tokens == 5
    assert tree.match_prefix([7]) == 0


def test_insert_counts_only_new_tokens_and_the_hit_rate():
    tree = RadixTree()
    tree.insert([1, 2, 3])
    assert tree.insert([1, 2, 3]) == 3
    assert tree.inserted_tokens == 3
    tree.match_prefix([1, 2, 3, 4])
    tree.match_prefix([5, 6])
    assert (tree.hit_tokens, tree.queried_tokens) == (3, 6)
    assert tree.hit_rate == pytest.approx(0.5)


def test_lru_leaf_is_evicted_first_and_its_parent_after_it():
    tree = RadixTree()
    tree.insert([1, 2, 3])       # t1
    tree.insert([1, 2, 4, 5])    # t2: [1, 2] -> [3], [4, 5]
    tree.insert([9, 9])          # t3
    tree.match_prefix([1, 2, 4])  # t4 touches [1,2] and splits [4, 5]
    assert tree.evict(1) == 1     # the oldest leaf is [3]
    assert sorted(tree.sequences()) == [(1, 2, 4, 5), (9, 9)]
    assert tree.evict(2) == 2     # then [9, 9] (t3), not the path touched at t4
    assert tree.sequences() == [(1, 2, 4, 5)]
    assert tree.evict(100) == 4   # leaves first, then the parents they leave bare
    assert tree.total_tokens == 0 and tree.nodes() == []
    assert tree.evicted_tokens == 7


def test_locked_path_is_never_evicted_until_unlocked():
    tree = RadixTree()
    tree.insert([1, 2, 3])
    tree.insert([4, 5])
    handle = tree.lock([1, 2, 3, 7])
    assert tree.evict(100) == 2
    assert tree.sequences() == [(1, 2, 3)]
    tree.match_prefix([1, 9])     # a split below a lock keeps the whole path locked
    assert tree.evict(100) == 0
    tree.unlock(handle)
    assert tree.evict(100) == 3
    with pytest.raises(ValueError, match="still locked"):
        tree.unlock(handle)


def test_capacity_evicts_before_inserting_and_keeps_the_matched_prefix():
    tree = RadixTree(capacity_tokens=6)
    tree.insert([1, 2, 3, 4])
    tree.insert([5, 6])
    tree.match_prefix([5, 6])        # [5, 6] is now more recent than [1..4]
    tree.insert([5, 6, 7, 8])        # needs 2 more tokens: evicts the LRU leaf [1, 2, 3, 4]
    assert sorted(tree.sequences()) == [(5, 6, 7, 8)]
    assert tree.total_tokens <= 6
    # locked tokens fill the tree: the new sequence's tail beyond the capacity is not stored
    tree.lock([5, 6, 7, 8])
    assert tree.insert([9, 9, 9]) == 0
    assert tree.total_tokens == 6 and tree.match_prefix([9, 9, 9]) == 2


def test_bad_input_raises():
    with pytest.raises(ValueError, match="capacity_tokens"):
        RadixTree(capacity_tokens=0)
    with pytest.raises(ValueError, match="integers"):
        RadixTree().insert(["a"])
    with pytest.raises(ValueError, match="num_tokens"):
        RadixTree().evict(-1)


sequences = st.lists(st.lists(st.integers(0, 3), max_size=12), max_size=12)


@settings(max_examples=200, deadline=None)
@given(inserted=sequences, queries=sequences)
def test_match_equals_longest_common_prefix_with_any_inserted_sequence(inserted, queries):
    tree = RadixTree()
    for seq in inserted:
        tree.insert(seq)
    for query in queries:
        assert tree.match_prefix(query) == max((lcp(query, s) for s in inserted), default=0)
    assert tree.total_tokens == sum(len(n.tokens) for n in tree.nodes())


@settings(max_examples=200, deadline=None)
@given(inserted=sequences, queries=sequences, capacity=st.integers(1, 30))
def test_with_eviction_match_equals_lcp_with_the_sequences_still_held(inserted, queries, capacity):
    tree = RadixTree(capacity_tokens=capacity)
    for seq in inserted:
        tree.insert(seq)
        assert tree.total_tokens <= capacity
    held = tree.sequences()
    for s in held:  # what is held was inserted: every held path is a prefix of an inserted sequence
        assert any(tuple(x[:len(s)]) == s for x in inserted)
    for query in queries:
        assert tree.match_prefix(query) == max((lcp(query, s) for s in held), default=0)
