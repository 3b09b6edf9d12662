"""utils.parallel.comm.collectives: the ring all-reduce at odd sizes, odd world sizes, subgroups."""

import pytest
import torch
import torch.distributed as dist

from utils.dist import launch
from utils.parallel.comm.collectives import chunk_bounds, ring_all_reduce

SHAPES = [(1,), (2,), (3,), (5,), (7,), (13,), (1000,), (3, 5), (2, 3, 7)]


def _rank_tensor(rank: int, shape, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=dtype)
    return torch.randint(-100, 100, shape, generator=g, dtype=dtype)


def _ring_vs_expected(rank, world_size, shapes, dtype):
    real_all_reduce = dist.all_reduce

    def forbidden(*args, **kwargs):
        raise AssertionError("ring_all_reduce must not call dist.all_reduce")

    dist.all_reduce = forbidden  # prove that only point-to-point messages are used
    try:
        results = []
        for shape in shapes:
            t = _rank_tensor(rank, shape, dtype)
            out = ring_all_reduce(t)
            assert out is t, "ring_all_reduce must work in place and return its argument"
            results.append(t.clone())
    finally:
        dist.all_reduce = real_all_reduce
    return results


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_ring_sums_odd_sizes_over_odd_world_sizes(world_size):
    out = launch(_ring_vs_expected, world_size, SHAPES, torch.float64, timeout=60)
    for i, shape in enumerate(SHAPES):
        expected = sum(_rank_tensor(r, shape, torch.float64) for r in range(world_size))
        for rank in range(world_size):
            torch.testing.assert_close(out[rank][i], expected)


def test_ring_sums_integers_exactly():
    out = launch(_ring_vs_expected, 3, [(11,), (4, 4)], torch.int64)
    for i, shape in enumerate([(11,), (4, 4)]):
        expected = sum(_rank_tensor(r, shape, torch.int64) for r in range(3))
        assert all(torch.equal(o[i], expected) for o in out)


def _ring_on_subgroup(rank, world_size):
    group = dist.new_group([1, 3])
    t = torch.full((5,), float(rank))
    if rank in (1, 3):
        ring_all_reduce(t, group=group)
    return t


def test_ring_on_a_subgroup_only_touches_its_members():
    out = launch(_ring_on_subgroup, 4)
    torch.testing.assert_close(out[1], torch.full((5,), 4.0))
    torch.testing.assert_close(out[3], torch.full((5,), 4.0))
    torch.testing.assert_close(out[0], torch.zeros(5))
    torch.testing.assert_close(out[2], torch.full((5,), 2.0))


def _ring_non_contiguous(rank, world_size):
    base = torch.arange(12.0).reshape(3, 4) * (rank + 1)
    view = base.t()  # not contiguous
    ring_all_reduce(view)
    return base


def test_ring_on_a_non_contiguous_view_writes_back():
    out = launch(_ring_non_contiguous, 2)
    torch.testing.assert_close(out[0], torch.arange(12.0).reshape(3, 4) * 3)


@pytest.mark.parametrize("numel, n", [(10, 3), (2, 4), (0, 2), (8, 8), (1, 1)])
def test_chunk_bounds_cover_everything_evenly(numel, n):
    bounds = chunk_bounds(numel, n)
    sizes = [e - s for s, e in bounds]
    assert len(bounds) == n and sum(sizes) == numel
    assert max(sizes) - min(sizes) <= 1
    assert all(bounds[i][1] == bounds[i + 1][0] for i in range(n - 1))


def test_bad_input_raises():
    with pytest.raises(ValueError, match="torch.Tensor"):
        ring_all_reduce([1.0, 2.0])
    with pytest.raises(ValueError, match="process group"):
        ring_all_reduce(torch.ones(3))
    with pytest.raises(ValueError):
        chunk_bounds(5, 0)


def _ring_sent_elements(rank, world_size, sizes):
    real_batch = dist.batch_isend_irecv
    sent = {numel: [] for numel in sizes}
    results = []

    try:
        for numel in sizes:
            def counting(ops, log=sent[numel]):
                log.extend(op.tensor.numel() for op in ops if op.op is dist.isend)
                return real_batch(ops)

            dist.batch_isend_irecv = counting
            results.append(ring_all_reduce(torch.ones(numel)))
    finally:
        dist.batch_isend_irecv = real_batch
    return sent, results


def test_ring_sends_two_n_minus_one_over_n_of_the_buffer():
    # 12 elements over 3 ranks: chunks of 4 and n - 1 = 2 sends in each phase, so every rank sends
    # 4 messages of 4 elements, 16 = 2 (n - 1) / n * 12: the bandwidth-optimal volume. An extra
    # all-gather step still sums correctly but sends 20.
    # 10 elements: chunks 4, 3, 3; rank 0 sends chunks 0, 2 then 1, 0 (14), ranks 1 and 2 send 13.
    out = launch(_ring_sent_elements, 3, [12, 10], timeout=60)
    for rank, (sent, results) in enumerate(out):
        assert sent[12] == [4, 4, 4, 4], f"rank {rank} sent {sent[12]} elements of a 12-element buffer"
        for numel, t in zip([12, 10], results):
            torch.testing.assert_close(t, torch.full((numel,), 3.0))
    assert [sum(sent[10]) for sent, _ in out] == [14, 13, 13]
