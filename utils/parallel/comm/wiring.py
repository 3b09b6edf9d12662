"""Explicit wiring of small fabrics, the paths packets take through them, and hash-routing collisions.

:func:`utils.parallel.comm.topology.clos` sizes a fabric; :func:`wiring` lists its
every cable (host ``i`` on leaf ``i // hosts_per_leaf``, every leaf on every
spine of its pod, spine ``j`` of every pod on the same group of cores), so a
small one can be drawn and searched: :func:`shortest_path` finds the switches
a packet crosses. Large clusters route each flow by hashing its header onto
one of the equal-cost paths (ECMP); :func:`ecmp_expected_busy_paths` counts
how many of them big flows leave idle.
"""

from __future__ import annotations

from collections import deque

from utils.parallel.comm.topology import Fabric
from utils.validate import check_positive_int

Node = tuple[str, int]
"""A node of a wiring: ``("host", i)``, ``("leaf", i)``, ``("spine", i)`` or ``("core", i)``."""

MAX_WIRED_HOSTS = 4096


def wiring(fabric: Fabric) -> list[tuple[Node, Node]]:
    """Every cable of ``fabric`` as a (lower, upper) pair of nodes; parallel cables repeat.

    Host ``i`` plugs into leaf ``i // hosts_per_leaf``. Only for fabrics of at
    most :data:`MAX_WIRED_HOSTS` hosts (the list has one entry per cable).
    """
    if not isinstance(fabric, Fabric):
        raise ValueError(f"fabric must be a Fabric (build one with clos()), got {type(fabric).__name__}")
    if fabric.n_hosts > MAX_WIRED_HOSTS:
        raise ValueError(f"wiring lists every cable; use at most {MAX_WIRED_HOSTS} hosts, got {fabric.n_hosts}")
    d, u, k = fabric.hosts_per_leaf, fabric.uplinks_per_leaf, fabric.radix
    links: list[tuple[Node, Node]] = [(("host", i), ("leaf", i // d)) for i in range(fabric.n_hosts)]
    if fabric.tiers == 1:
        return [(h, ("leaf", 0)) for h, _ in links]
    leaves = fabric.switches_per_tier[0]
    if fabric.tiers == 2:
        spines = fabric.switches_per_tier[1]
        for leaf in range(leaves):
            for spine in range(spines):
                links += [(("leaf", leaf), ("spine", spine))] * (u // spines)
        return links
    half = k // 2
    group = fabric.switches_per_tier[2] // u
    for leaf in range(leaves):
        pod = leaf // half
        links += [(("leaf", leaf), ("spine", pod * u + j)) for j in range(u)]
    for spine in range(fabric.switches_per_tier[1]):
        j = spine % u
        for c in range(group):
            links += [(("spine", spine), ("core", j * group + c))] * (half // group)
    return links


def shortest_path(links: list[tuple[Node, Node]], src: Node, dst: Node) -> list[Node]:
    """The nodes of a shortest path from ``src`` to ``dst`` through ``links`` (breadth-first search).

    Ties go to the lowest-numbered neighbour, so the path is deterministic.
    The number of switches crossed is ``len(path) - 2`` between two hosts.
    """
    neighbours: dict[Node, set[Node]] = {}
    for a, b in links:
        neighbours.setdefault(a, set()).add(b)
        neighbours.setdefault(b, set()).add(a)
    for node in (src, dst):
        if node not in neighbours:
            raise ValueError(f"{node} is not connected to anything in these links")
    parent: dict[Node, Node | None] = {src: None}
    queue = deque([src])
    while queue:
        node = queue.popleft()
        if node == dst:
            break
        for nxt in sorted(neighbours[node]):
            if nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    if dst not in parent:
        raise ValueError(f"{dst} cannot be reached from {src}")
    path = [dst]
    while parent[path[-1]] is not None:
        path.append(parent[path[-1]])
    return path[::-1]


# --- Static (hash-based) routing: collisions of big flows -------------------------------------------------


def ecmp_expected_busy_paths(flows: int, paths: int) -> float:
    """Expected number of paths that carry at least one flow when ``flows`` flows are hashed onto ``paths``.

    Equal-cost multi-path routing picks a path per flow by hashing its header,
    independently and uniformly: ``paths (1 - (1 - 1/paths)^flows)`` (balls into bins).
    The other paths sit idle while some carry two or more flows.
    """
    check_positive_int("flows", flows)
    check_positive_int("paths", paths)
    return paths * (1 - (1 - 1 / paths) ** flows)
