import pytest

from utils.serving.prefix_hash import ROOT_HASH, block_hashes


def test_only_full_blocks_are_hashed():
    assert len(block_hashes(list(range(9)), 4)) == 2
    assert block_hashes([1, 2, 3], 4) == []


def test_hash_names_the_whole_prefix():
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4)  # same second block, different first
    assert a[1] != b[1]
    assert block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 0], 4) == a


def test_hashes_extend_block_by_block():
    tokens = list(range(12))
    whole = block_hashes(tokens, 4)
    assert block_hashes(tokens[4:], 4, parent=whole[0]) == whole[1:]
    assert block_hashes(tokens[:4], 4, parent=ROOT_HASH) == whole[:1]


def test_block_size_must_be_positive():
    with pytest.raises(ValueError, match="block_size"):
        block_hashes([1], 0)
