import pytest

from utils.serving.runtime.prefix_hash import ROOT_HASH, block_hashes


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


def test_the_default_is_sha256_of_an_unambiguous_encoding():
    import hashlib
    import struct

    first, second = block_hashes(list(range(8)), 4)
    assert first == hashlib.sha256(struct.pack("<bq", 0, 0) + struct.pack("<4q", 0, 1, 2, 3)).digest()
    assert second == hashlib.sha256(first + struct.pack("<bq", 0, 0) + struct.pack("<4q", 4, 5, 6, 7)).digest()
    assert len(first) == 32 and block_hashes([2 ** 40, -1], 2) != block_hashes([2 ** 40 - 1, -1], 2)


def test_a_salt_separates_tenants_all_along_the_chain():
    tokens = list(range(12))
    plain, alice, bob = (block_hashes(tokens, 4, salt=s) for s in (None, "alice", "bob"))
    assert block_hashes(tokens, 4, salt="alice") == alice  # the same tenant shares
    for a, b, c in zip(plain, alice, bob):  # another tenant, or no salt, shares no block
        assert len({a, b, c}) == 3
    assert block_hashes(tokens, 4, salt="") != plain  # an empty salt is a salt
    assert block_hashes(tokens[4:], 4, parent=alice[0]) == alice[1:]  # extending a salted chain
    with pytest.raises(ValueError, match="first block"):
        block_hashes(tokens[4:], 4, parent=alice[0], salt="alice")


def test_builtin_hashes_chain_the_same_way_in_8_bytes():
    tokens = list(range(12))
    whole = block_hashes(tokens, 4, algorithm="builtin")
    assert [len(h) for h in whole] == [8, 8, 8]
    assert block_hashes(tokens[4:], 4, parent=whole[0], algorithm="builtin") == whole[1:]
    assert whole[0] == hash((0, None, (0, 1, 2, 3))).to_bytes(8, "little", signed=True)
    assert whole != block_hashes(tokens, 4)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="algorithm must be one of"):
        block_hashes([1, 2], 2, algorithm="md5")
    with pytest.raises(ValueError, match="parent must be a block hash"):
        block_hashes([1, 2], 2, parent=0)


@pytest.mark.parametrize("algorithm", ["sha256", "builtin"])
def test_every_algorithm_chains_so_a_hash_names_the_whole_prefix(algorithm):
    # Same second block after different first blocks: the second hashes must differ, or a request would
    # reuse keys and values computed after another prefix. Equal first blocks give equal hashes.
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, algorithm=algorithm)
    b = block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4, algorithm=algorithm)
    c = block_hashes([1, 2, 3, 4, 0, 0, 0, 0], 4, algorithm=algorithm)
    assert a[0] != b[0] and a[1] != b[1]
    assert a[0] == c[0] and a[1] != c[1]
