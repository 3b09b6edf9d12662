"""utils.parallel.comm.topology: fabric sizes against closed forms and published tables."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from utils.gpu import memory_hierarchy
from utils.gpu.hardware import spec
from utils.parallel.comm.bandwidth import gbit_per_s_to_bytes_per_s
from utils.parallel.comm.topology import (
    PUBLISHED,
    SUPERPOD_COMPUTE_FABRIC,
    clos,
    fat_tree,
    fat_tree_max_hosts,
    fat_tree_switches,
    full_mesh_links,
    full_mesh_ports_per_node,
    leaf_ports,
    leaf_spine,
    max_hosts,
    min_tiers,
    single_switch,
    worst_case_hops,
)

# --- published figures -------------------------------------------------------


def test_full_mesh_of_200k_gpus_needs_about_20_billion_cables():
    assert full_mesh_links(200_000) == 19_999_900_000
    assert f"{full_mesh_links(200_000):.1e}" == "2.0e+10"
    assert full_mesh_ports_per_node(200_000) == 199_999
    assert full_mesh_links(2) == 1 and full_mesh_links(1) == 0


def test_al_fares_k48_fat_tree():
    # Al-Fares et al. (SIGCOMM 2008): 48-port switches, k^3/4 = 27,648 hosts, 5k^2/4 = 2,880 switches.
    assert fat_tree_max_hosts(48, 3) == PUBLISHED["fat_tree_k48_hosts"].value == 48**3 // 4
    assert fat_tree_switches(48, 3) == 5 * 48**2 // 4 == 2880
    built = clos(27_648, 48, 3)
    assert built.switches_per_tier == (1152, 1152, 576)  # k pods of k/2 edge + k/2 aggregation, (k/2)^2 cores
    assert built.switches == 2880 and built.pods == 48


def test_two_tier_limit_of_64_port_switches_is_k_squared_over_2():
    assert max_hosts(64, 2) == 64**2 // 2 == 2048
    assert leaf_spine(2048, 64).switches_per_tier == (64, 32)  # k leaves, k/2 spines: 3k/2 switches
    with pytest.raises(ValueError, match="do not fit"):
        leaf_spine(2049, 64)


def test_superpod_scalable_unit_is_256_gpus():
    gpus = PUBLISHED["superpod_su_nodes"].value * PUBLISHED["dgx_h100_gpus"].value
    assert gpus == 256 == SUPERPOD_COMPUTE_FABRIC[1]["gpu_ports"]
    assert PUBLISHED["dgx_h100_compute_nics"].value == PUBLISHED["dgx_h100_gpus"].value  # one NIC per GPU


@pytest.mark.parametrize("su", sorted(SUPERPOD_COMPUTE_FABRIC))
def test_superpod_compute_fabric_table(su):
    row = SUPERPOD_COMPUTE_FABRIC[su]
    radix = int(PUBLISHED["quantum2_ports"].value)
    fabric = clos(row["gpu_ports"], radix, min_tiers(row["gpu_ports"], radix))
    expected = tuple(n for n in (row["leaf"], row["spine"], row["core"]) if n)
    assert fabric.switches_per_tier == expected
    assert fabric.links_per_tier[1] == row["leaf_spine_cables"]
    assert fabric.tiers == (3 if row["core"] else 2)


def test_llama3_pods_fit_in_two_tiers_of_64_ports_only_with_oversubscription():
    pod = int(PUBLISHED["llama3_pod_gpus"].value)
    assert pod > max_hosts(64, 2)
    assert pod <= max_hosts(64, 2, oversubscription=3)  # 48 down, 16 up: 64 * 48 = 3072
    assert max_hosts(64, 2, oversubscription=3) == 3072


def test_nvlink_vs_nic_per_gpu_one_direction():
    nvlink_one_way = PUBLISHED["h100_nvlink_bytes_per_s"].value / 2
    nic = gbit_per_s_to_bytes_per_s(PUBLISHED["connectx7_gbit_per_s"].value)
    assert nic == 50e9
    assert nvlink_one_way / nic == pytest.approx(9.0)
    assert PUBLISHED["h100_nvlink_bytes_per_s"].value / PUBLISHED["h100_nvlink_links"].value == 50e9


def test_figures_whose_home_is_part_1_are_read_from_there():
    # One place for each figure: the NVLink bandwidth lives in the GPU spec table, the GPUs per DGX node
    # in the memory-hierarchy table; the fabric table only reads them.
    assert PUBLISHED["h100_nvlink_bytes_per_s"].value == spec("H100-SXM").nvlink_bandwidth
    assert "NVLink 900 GB/s" in PUBLISHED["h100_nvlink_bytes_per_s"].source
    assert PUBLISHED["dgx_h100_gpus"] is memory_hierarchy.PUBLISHED["H100-SXM"]["gpus_per_node"]


# --- closed forms against the constructive sizing ----------------------------


@pytest.mark.parametrize("radix", [2, 4, 6, 8, 16, 24, 32, 48, 64])
@pytest.mark.parametrize("tiers", [1, 2, 3])
def test_full_fat_tree_matches_closed_forms(radix, tiers):
    hosts = fat_tree_max_hosts(radix, tiers)
    fabric = clos(hosts, radix, tiers)
    assert fabric.switches == fat_tree_switches(radix, tiers)
    assert fabric.max_hosts == hosts == max_hosts(radix, tiers)
    assert fabric.worst_case_hops == worst_case_hops(tiers)
    # non-blocking: every tier carries one cable per host
    assert all(links == hosts for links in fabric.links_per_tier)


def test_worst_case_hops():
    assert [worst_case_hops(t) for t in (1, 2, 3)] == [1, 3, 5]


def test_leaf_ports_split():
    assert leaf_ports(64) == (32, 32)
    assert leaf_ports(64, 3) == (48, 16)
    assert leaf_ports(64, 7) == (56, 8)
    assert leaf_ports(64, 0.5) == (21, 43)


# --- properties --------------------------------------------------------------

POW2_RADIX = st.sampled_from([4, 8, 16, 32, 64, 128, 256])


@given(POW2_RADIX, st.sampled_from([1, 3, 7]), st.data())
@settings(max_examples=300, deadline=None)
def test_more_radix_never_needs_more_switches(radix, r, data):
    # Fewest tiers that fit, power-of-two radix (as real switch ASICs), r whose split is exact.
    assume(radix * r % (r + 1) == 0)
    n_hosts = data.draw(st.integers(1, max_hosts(radix, 3, r)))
    small = clos(n_hosts, radix, min_tiers(n_hosts, radix, r), r)
    big = clos(n_hosts, 2 * radix, min_tiers(n_hosts, 2 * radix, r), r)
    assert big.switches <= small.switches
    assert big.worst_case_hops <= small.worst_case_hops


@given(st.sampled_from([8, 16, 32, 64]), st.sampled_from([1.0, 2.0, 3.0]), st.integers(1, 200_000))
@settings(max_examples=200, deadline=None)
def test_fits_exactly_up_to_max_hosts(radix, r, n_hosts):
    for tiers in (1, 2, 3):
        limit = max_hosts(radix, tiers, r)
        if n_hosts <= limit:
            fabric = clos(n_hosts, radix, tiers, r)
            assert fabric.tiers == tiers and fabric.n_hosts == n_hosts
        else:
            with pytest.raises(ValueError):
                clos(n_hosts, radix, tiers, r)
    assert clos(max_hosts(radix, 2, r), radix, 2, r).switches_per_tier[0] == radix


# --- bad input ---------------------------------------------------------------


@pytest.mark.parametrize("call", [
    lambda: full_mesh_links(0),
    lambda: fat_tree_max_hosts(7, 2),
    lambda: fat_tree_max_hosts(0, 2),
    lambda: max_hosts(64, 4),
    lambda: leaf_ports(64, 0),
    lambda: leaf_ports(64, float("nan")),
    lambda: leaf_ports(4, 0.1),
    lambda: single_switch(65, 64),
    lambda: clos(0, 64, 2),
    lambda: clos(10, 64, 2.0),
    lambda: min_tiers(10**9, 64),
])
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()


def test_every_published_figure_has_a_source():
    for name, fig in PUBLISHED.items():
        assert fig.source and fig.unit and fig.value > 0, name
    for row in SUPERPOD_COMPUTE_FABRIC.values():
        assert row["source"] and row["gpu_ports"] % 256 == 0
