"""utils.attention.flash_schedule: causal tile classes against a brute-force mask, list scheduling, GQA loads."""

import math

import pytest
import torch

from utils.attention.flash_schedule import (
    causal_row_tile_work,
    causal_tile_counts,
    gqa_kv_tile_loads,
    list_schedule_makespan,
)


@pytest.mark.parametrize("n, bm, bn", [(256, 64, 64), (256, 128, 64), (250, 64, 32), (100, 32, 64), (7, 16, 16)])
def test_tile_classes_match_the_mask_tile_by_tile(n, bm, bn):
    """Classify each (row tile, key tile) by the causal mask itself: all visible, partly, or none."""
    visible = torch.ones(n, n, dtype=torch.bool).tril()
    unmasked = masked = skipped = computed = 0
    for r in range(0, n, bm):
        for c in range(0, n, bn):
            block = visible[r:r + bm, c:c + bn]
            if block.all():
                unmasked += 1
            elif block.any():
                masked += 1
            else:
                skipped += 1
            if block.any():
                computed += block.numel()
    got = causal_tile_counts(n, bm, bn)
    assert (got.unmasked, got.masked, got.skipped) == (unmasked, masked, skipped)
    assert got.useful_scores == int(visible.sum()) and got.computed_scores == computed


def test_square_tiles_mask_only_the_diagonal():
    t = causal_tile_counts(4096, 128, 128)
    assert t.masked == 32 and t.unmasked == 32 * 31 // 2 and t.visited == 32 * 33 // 2  # the chapter's 528 of 1024
    assert t.computed_scores / t.useful_scores - 1 == pytest.approx(128 / 4096, rel=0.01)  # waste ~ B / N


def test_heavy_first_shortens_the_tail():
    work = causal_row_tile_work(4096, 128, 128, heads=8)  # 256 programs of 1 .. 32 key tiles
    assert sum(work) == 8 * 32 * 33 // 2
    in_order = list_schedule_makespan(work, 132)
    heavy_first = list_schedule_makespan(sorted(work, reverse=True), 132)
    lower_bound = max(max(work), sum(work) / 132)
    assert heavy_first < in_order and heavy_first <= (4 / 3) * lower_bound
    assert list_schedule_makespan([3, 3, 2, 2, 2], 2) == 7  # Graham's example of LPT: 7 against an optimum of 6


def test_gqa_packing_loads_each_kv_tile_once_per_group():
    unpacked = gqa_kv_tile_loads(4096, 128, q_heads=32, kv_heads=8, block_m=64)
    packed = gqa_kv_tile_loads(4096, 128, q_heads=32, kv_heads=8, block_m=64, packed=True)
    assert unpacked == 32 * 64 * 2 * 4096 * 128 * 2 and unpacked / packed == 4
    decode = gqa_kv_tile_loads(1, 128, 32, 8, block_m=16, kv_len=4096)  # one query row: a program per head
    assert decode == 32 * 2 * 4096 * 128 * 2
    assert decode / gqa_kv_tile_loads(1, 128, 32, 8, block_m=16, kv_len=4096, packed=True) == 4


@pytest.mark.parametrize("call, match", [
    (lambda: causal_tile_counts(0, 16, 16), "seq_len"),
    (lambda: list_schedule_makespan([], 4), "work"),
    (lambda: list_schedule_makespan([1.0], 0), "n_workers"),
    (lambda: gqa_kv_tile_loads(64, 16, 6, 4, 16), "multiple"),
])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_recorded_tile_sweep_reads_the_file_fastest_first():
    from utils.attention.flash_schedule import recorded_tile_sweep

    sweep = recorded_tile_sweep()
    assert set(sweep) == {4096, 8192}
    for n, entry in sweep.items():
        rates = [c.tflops for c in entry["configs"]]
        assert rates == sorted(rates, reverse=True) and len(rates) == 8
        default = [c for c in entry["configs"] if (c.block_m, c.block_n, c.warps, c.stages) == (64, 64, 4, 3)]
        assert default and default[0].tflops == entry["default"]  # the kernel's default tiles are in the sweep
    best = sweep[8192]["configs"][0]
    assert (best.block_m, best.block_n, best.warps, best.stages) == (128, 128, 8, 3)
    with pytest.raises(ValueError, match="no tile sweep"):
        recorded_tile_sweep("no-such-gpu")
