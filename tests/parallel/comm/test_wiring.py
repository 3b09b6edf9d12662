"""utils.parallel.comm.wiring: every cable of a small fabric, the paths through it, and ECMP collisions."""

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from utils.parallel.comm.topology import clos, fat_tree, max_hosts, worst_case_hops
from utils.parallel.comm.wiring import ecmp_expected_busy_paths, shortest_path, wiring


@given(st.sampled_from([4, 6, 8, 10, 12]), st.sampled_from([1.0, 2.0, 3.0]), st.data())
@settings(max_examples=60, deadline=None)
def test_wiring_respects_ports_and_counts(radix, r, data):
    tiers = data.draw(st.sampled_from([1, 2, 3]))
    n_hosts = data.draw(st.integers(1, max_hosts(radix, tiers, r)))
    fabric = clos(n_hosts, radix, tiers, r)
    links = wiring(fabric)
    assert len(links) == fabric.cables
    ports = Counter(node for link in links for node in link)
    hosts = [node for node in ports if node[0] == "host"]
    assert len(hosts) == n_hosts and all(ports[h] == 1 for h in hosts)
    assert max(count for node, count in ports.items() if node[0] != "host") <= radix
    for kind, count in zip(("leaf", "spine", "core"), fabric.switches_per_tier):
        assert {node for node in ports if node[0] == kind} == {(kind, i) for i in range(count)}


@pytest.mark.parametrize("n_hosts, radix, tiers, r", [
    (8, 4, 2, 1.0), (16, 4, 3, 1.0), (12, 8, 2, 3.0), (40, 8, 3, 1.0), (100, 12, 3, 2.0), (1, 4, 3, 1.0),
])
def test_worst_case_hops_by_search(n_hosts, radix, tiers, r):
    fabric = clos(n_hosts, radix, tiers, r)
    links = wiring(fabric)
    hops = max(len(shortest_path(links, ("host", 0), ("host", j))) - 2 for j in range(n_hosts)) if n_hosts > 1 else 1
    assert hops == fabric.worst_case_hops
    assert fabric.worst_case_hops <= worst_case_hops(tiers)


def test_shortest_path_across_a_k4_fat_tree():
    links = wiring(fat_tree(16, 4))
    path = shortest_path(links, ("host", 0), ("host", 15))
    assert [kind for kind, _ in path] == ["host", "leaf", "spine", "core", "spine", "leaf", "host"]
    assert shortest_path(links, ("host", 0), ("host", 1)) == [("host", 0), ("leaf", 0), ("host", 1)]
    with pytest.raises(ValueError):
        shortest_path(links, ("host", 0), ("host", 99))


# --- ECMP collisions ---------------------------------------------------------


def test_ecmp_formula_matches_simulation():
    rng = random.Random(0)
    trials = 4000
    busy = sum(len({rng.randrange(32) for _ in range(32)}) for _ in range(trials)) / trials
    assert ecmp_expected_busy_paths(32, 32) == pytest.approx(busy, rel=0.02)
    assert ecmp_expected_busy_paths(32, 32) == pytest.approx(32 * (1 - (31 / 32) ** 32))


@given(st.integers(1, 500), st.integers(1, 500))
def test_ecmp_busy_paths_bounded(flows, paths):
    busy = ecmp_expected_busy_paths(flows, paths)
    assert 1 - 1e-9 <= busy <= min(flows, paths) + 1e-9


@pytest.mark.parametrize("call", [
    lambda: wiring(clos(5000, 64, 3)),
    lambda: wiring("not a fabric"),
    lambda: ecmp_expected_busy_paths(0, 4),
    lambda: ecmp_expected_busy_paths(4, 0),
])
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()
