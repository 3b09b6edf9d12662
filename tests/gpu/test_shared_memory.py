"""utils.gpu.shared_memory: bank conflicts against cases worked by hand (CUDA Best Practices Guide rules)."""

import pytest

from utils.gpu import shared_memory as smem

LANES = range(32)


def test_bank_is_the_word_address_mod_32():
    assert [smem.bank_of_word(w) for w in (0, 1, 31, 32, 33, 65)] == [0, 1, 31, 0, 1, 1]
    assert smem.BANKS == 32 and smem.BANK_BYTES == 4


def test_row_read_of_a_32_wide_tile_is_conflict_free():
    words = [smem.tile_word_address(5, lane) for lane in LANES]
    assert smem.warp_banks(words) == list(LANES)
    assert smem.bank_conflict_ways(words) == 1


def test_column_read_of_a_32_wide_fp32_tile_is_a_32_way_conflict():
    words = [smem.tile_word_address(lane, 3) for lane in LANES]
    assert set(smem.warp_banks(words)) == {3}
    assert smem.bank_conflict_ways(words) == 32


def test_padding_the_row_to_33_words_makes_the_column_read_conflict_free():
    words = [smem.tile_word_address(lane, 3, row_pitch_words=33) for lane in LANES]
    assert sorted(smem.warp_banks(words)) == list(LANES)
    assert smem.bank_conflict_ways(words) == 1


def test_xor_swizzle_makes_rows_and_columns_conflict_free():
    column = [smem.tile_word_address(lane, 3, xor_swizzle=True) for lane in LANES]
    row = [smem.tile_word_address(7, lane, xor_swizzle=True) for lane in LANES]
    assert smem.bank_conflict_ways(column) == 1 and smem.bank_conflict_ways(row) == 1
    # Every element keeps its own word: the swizzle is a permutation of each row.
    tile = {smem.tile_word_address(r, c, xor_swizzle=True) for r in range(32) for c in range(32)}
    assert tile == set(range(32 * 32))


def test_stride_two_is_two_way_and_pitch_34_is_two_way():
    assert smem.bank_conflict_ways([2 * lane for lane in LANES]) == 2
    assert smem.bank_conflict_ways([smem.tile_word_address(lane, 0, row_pitch_words=34) for lane in LANES]) == 2


def test_same_word_is_a_broadcast_not_a_conflict():
    assert smem.bank_conflict_ways([7] * 32) == 1
    # Two distinct words in bank 0, each read by 16 threads: 2-way.
    assert smem.bank_conflict_ways([0] * 16 + [32] * 16) == 2


def test_bad_input_raises():
    with pytest.raises(ValueError):
        smem.bank_conflict_ways([])
    with pytest.raises(ValueError):
        smem.bank_conflict_ways(list(range(33)))
    with pytest.raises(ValueError):
        smem.bank_conflict_ways([-1])
    with pytest.raises(ValueError):
        smem.tile_word_address(0, 32, row_pitch_words=32)
    with pytest.raises(ValueError):
        smem.tile_word_address(0, 0, row_pitch_words=33, xor_swizzle=True)
