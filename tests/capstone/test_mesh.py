"""Tests of utils.capstone.mesh: the rank <-> coordinate map, the groups, and real gloo groups built from them."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

from utils.capstone.mesh import ORDER, Mesh, new_groups, nodes_spanned
from utils.dist import launch

LAYOUTS = [Mesh(2, 2, 2, 1), Mesh(2, 1, 2, 2), Mesh(1, 2, 2, 2), Mesh(2, 2, 1, 2), Mesh(3, 2, 1, 1), Mesh()]


@pytest.mark.parametrize("mesh", LAYOUTS, ids=str)
def test_coords_and_rank_are_inverse_and_tp_varies_fastest(mesh):
    seen = set()
    for rank in range(mesh.world_size):
        c = mesh.coords(rank)
        assert mesh.rank(**c) == rank
        assert rank == c["tp"] + mesh.tp * (c["cp"] + mesh.cp * (c["pp"] + mesh.pp * c["dp"]))
        seen.add(tuple(c[d] for d in ORDER))
    assert len(seen) == mesh.world_size


@pytest.mark.parametrize("mesh", LAYOUTS, ids=str)
def test_groups_partition_the_ranks_and_vary_only_their_dimensions(mesh):
    for r in range(1, len(ORDER) + 1):
        for dims in itertools.combinations(ORDER, r):
            groups = mesh.groups(dims)
            assert sorted(itertools.chain(*groups)) == list(range(mesh.world_size))
            assert all(len(g) == mesh.size(dims) for g in groups)
            for g in groups:
                fixed = {d: {mesh.coords(x)[d] for x in g} for d in ORDER if d not in dims}
                assert all(len(v) == 1 for v in fixed.values())
    assert mesh.groups(("dp", "cp")) == mesh.groups(("cp", "dp"))


def test_the_order_keeps_tensor_parallel_groups_inside_a_node():
    mesh = Mesh(dp=4, tp=8, pp=2, cp=2)  # 128 GPUs, 16 nodes of 8
    assert mesh.groups("tp")[0] == list(range(8))
    assert nodes_spanned(mesh, "tp") == 1
    assert nodes_spanned(mesh, "cp") == 2 and nodes_spanned(mesh, "pp") == 2
    assert nodes_spanned(mesh, "dp") == 4 and nodes_spanned(mesh, ("cp", "dp")) == 8


def test_bad_input():
    with pytest.raises(ValueError, match="tp"):
        Mesh(tp=0)
    with pytest.raises(ValueError, match="rank must be"):
        Mesh(2, 2).coords(4)
    with pytest.raises(ValueError, match="tp coordinate"):
        Mesh(2, 2).rank(tp=2)
    with pytest.raises(ValueError, match="unknown dimensions"):
        Mesh(2, 2).rank(ep=1)
    with pytest.raises(ValueError, match="dims must be"):
        Mesh(2, 2).groups(("tp", "tp"))
    with pytest.raises(ValueError, match="not initialised"):
        new_groups(Mesh(2), 0)


def _sum_ranks_over_groups(rank, world_size, mesh):
    groups = new_groups(mesh, rank)
    out = {}
    for dims, group in groups.items():
        x = torch.tensor([float(rank)])
        dist.all_reduce(x, group=group)
        out[dims] = float(x)
    return out


def test_gloo_groups_reduce_over_exactly_their_members():
    mesh = Mesh(dp=2, tp=2, pp=1, cp=2)
    results = launch(_sum_ranks_over_groups, mesh.world_size, mesh, backend="gloo", timeout=120)
    for rank, sums in enumerate(results):
        for dims, total in sums.items():
            assert total == sum(mesh.group_of(rank, dims)), (rank, dims)
    assert set(results[0]) == {("tp",), ("cp",), ("pp",), ("dp",), ("cp", "dp")}
