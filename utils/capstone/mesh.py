"""A 4D device mesh: which rank holds which coordinate, and the process groups each collective runs on.

A run with data, tensor, pipeline and context parallelism of sizes ``dp``, ``tp``, ``pp`` and ``cp``
uses ``dp * tp * pp * cp`` ranks, each at one coordinate ``(dp_i, tp_i, pp_i, cp_i)``. Llama 3 orders
the dimensions ``[TP, CP, PP, DP]`` from the fastest-varying (Dubey et al. 2024, "The Llama 3 Herd of
Models", arXiv:2407.21783, section 3.3.2)::

    rank = tp_i + tp * (cp_i + cp * (pp_i + pp * dp_i))

so that the groups that talk most often and move the most bytes are made of consecutive ranks: a
tensor-parallel group (an all-gather or reduce-scatter in every layer, forward and backward) lies
inside one node's NVLink domain whenever ``tp`` divides the GPUs per node, the context-parallel ring
next, the pipeline's point-to-point sends after that, and data parallelism, one reduction per step
that overlaps with backward, spans the whole cluster (:func:`nodes_spanned` counts this).

A *group along* some dimensions is a set of ranks that differ only in those coordinates.
:meth:`Mesh.groups` lists every one, and :func:`new_groups` creates them with ``dist.new_group``:
every rank must create every group, in the same order, even the groups it is not in (PyTorch's rule),
which this function does. Gradient reduction for parameters replicated over both data and context
parallelism (every parameter outside the tensor-parallel shards is replicated over both) runs on the
groups along ``("dp", "cp")``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch.distributed as dist

from utils.validate import check_positive_int

ORDER = ("tp", "cp", "pp", "dp")
"""The mesh's dimensions from the fastest-varying to the slowest (Llama 3, section 3.3.2)."""


def _dims(dims: str | Sequence[str]) -> tuple[str, ...]:
    dims = (dims,) if isinstance(dims, str) else tuple(dims)
    unknown = [d for d in dims if d not in ORDER]
    if unknown or len(set(dims)) != len(dims) or not dims:
        raise ValueError(f"dims must be one or more distinct names of {ORDER}, got {dims!r}")
    return tuple(d for d in ORDER if d in dims)  # canonical order, so ("dp", "cp") and ("cp", "dp") agree


@dataclass(frozen=True)
class Mesh:
    """The sizes of the four dimensions; ``world_size`` is their product."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        for name in ORDER:
            check_positive_int(name, getattr(self, name))

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def size(self, dims: str | Sequence[str]) -> int:
        """Ranks in one group along ``dims``."""
        n = 1
        for d in _dims(dims):
            n *= getattr(self, d)
        return n

    def coords(self, rank: int) -> dict[str, int]:
        """``{"tp": ..., "cp": ..., "pp": ..., "dp": ...}`` of ``rank``."""
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be an int in [0, {self.world_size}), got {rank!r}")
        out = {}
        for d in ORDER:
            rank, out[d] = divmod(rank, getattr(self, d))
        return out

    def rank(self, **coords: int) -> int:
        """The rank at ``coords`` (a coordinate left out is 0)."""
        unknown = set(coords) - set(ORDER)
        if unknown:
            raise ValueError(f"unknown dimensions {sorted(unknown)}; the mesh's are {ORDER}")
        rank, stride = 0, 1
        for d in ORDER:
            i = coords.get(d, 0)
            if not isinstance(i, int) or not 0 <= i < getattr(self, d):
                raise ValueError(f"{d} coordinate must be an int in [0, {getattr(self, d)}), got {i!r}")
            rank += i * stride
            stride *= getattr(self, d)
        return rank

    def groups(self, dims: str | Sequence[str]) -> list[list[int]]:
        """Every group along ``dims``: lists of ranks, each sorted, in order of their smallest rank."""
        along = _dims(dims)
        fixed = [d for d in ORDER if d not in along]
        out = []
        for others in itertools.product(*(range(getattr(self, d)) for d in fixed)):
            base = dict(zip(fixed, others))
            members = [self.rank(**base, **dict(zip(along, free)))
                       for free in itertools.product(*(range(getattr(self, d)) for d in along))]
            out.append(sorted(members))
        return sorted(out)

    def group_of(self, rank: int, dims: str | Sequence[str]) -> list[int]:
        """The group along ``dims`` that holds ``rank``."""
        self.coords(rank)
        return next(g for g in self.groups(dims) if rank in g)


def nodes_spanned(mesh: Mesh, dims: str | Sequence[str], gpus_per_node: int = 8) -> int:
    """How many nodes of ``gpus_per_node`` consecutive ranks the widest group along ``dims`` touches."""
    check_positive_int("gpus_per_node", gpus_per_node)
    return max(len({r // gpus_per_node for r in g}) for g in mesh.groups(dims))


DEFAULT_GROUPS = (("tp",), ("cp",), ("pp",), ("dp",), ("cp", "dp"))
"""The groups a 4D step uses: each dimension's, and data x context for the replicated gradients."""


def new_groups(mesh: Mesh, rank: int, dims_list: Sequence[Sequence[str]] = DEFAULT_GROUPS,
               backend: str | None = None) -> dict[tuple[str, ...], dist.ProcessGroup]:
    """Create every group along each entry of ``dims_list`` (on every rank, in one order); return ``rank``'s.

    Call it on every rank of an initialised world of ``mesh.world_size`` ranks. The result maps the
    canonical dimension tuple (``("cp", "dp")`` for either spelling) to this rank's group.
    """
    if not dist.is_initialized():
        raise ValueError("torch.distributed is not initialised: call new_groups inside a launched worker")
    if dist.get_world_size() != mesh.world_size:
        raise ValueError(f"the world has {dist.get_world_size()} ranks but the mesh {mesh} needs {mesh.world_size}")
    mine = {}
    for dims in dims_list:
        key = _dims(dims)
        for members in mesh.groups(key):
            group = dist.new_group(members, backend=backend)
            if rank in members:
                mine[key] = group
    return mine
