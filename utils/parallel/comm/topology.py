"""How GPUs are wired together: switch fabrics and what they cost.

A cluster has two networks. *Scale-up* links (NVLink through NVSwitch) join
the few GPUs of one node at hundreds of GB/s; a *scale-out* fabric
(InfiniBand or Ethernet) joins the nodes through layers of switches, each with
a fixed number of ports, its *radix* ``k``. This module sizes such fabrics:
switches and cables per tier, and the hops between two hosts. The cables
themselves and the paths through them are in :mod:`utils.parallel.comm.wiring`;
the price of an all-reduce across the two levels in
:func:`utils.parallel.comm.network.hierarchical_allreduce_time`.

Fabrics here are folded Clos networks (Clos, "A study of non-blocking switching
networks", Bell System Technical Journal 32(2), 1953) built from identical
radix-``k`` switches, named as in NVIDIA's DGX SuperPOD documents: hosts
(GPU network ports) plug into *leaf* switches, leaves into *spine* switches,
spines into *core* switches. With no oversubscription, ``t`` tiers connect
``2 (k/2)^t`` hosts: ``k``, ``k^2/2``, ``k^3/4`` (the k-ary fat tree of
Al-Fares, Loukissas and Vahdat, "A Scalable, Commodity Data Center Network
Architecture", SIGCOMM 2008, whose edge/aggregation/core are our
leaf/spine/core).

Published figures used by the book live in :data:`PUBLISHED` and
:data:`SUPERPOD_COMPUTE_FABRIC`, each with its source. Two of them have their
home in part 1's tables and are read from there: the H100's NVLink bandwidth
(:data:`utils.gpu.hardware.GPUS`) and the GPUs per DGX H100 node
(:data:`utils.gpu.memory_hierarchy.PUBLISHED`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from utils.gpu import hardware, memory_hierarchy
from utils.published import Published
from utils.validate import check_positive, check_positive_int

# --- Published figures, with their sources ----------------------------------------------------------------

_H100_WP = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), fourth-generation NVLink"
_DGX_UG = "NVIDIA DGX H100 User Guide, hardware overview"
_QM9700 = "NVIDIA Quantum-2 QM9700/QM9790 1U NDR 400Gb/s InfiniBand switch systems datasheet"
_SN5600 = "NVIDIA Spectrum-4 SN5600 Ethernet switch datasheet (Spectrum-X platform)"
_RA_H100 = ("NVIDIA DGX SuperPOD Reference Architecture featuring DGX H100 systems "
            "(RA-11333-001), Table 4 'Compute fabric component count'")
_RA_B200 = ("NVIDIA DGX SuperPOD Reference Architecture featuring DGX B200 systems, "
            "table 'Larger DGX SuperPOD component counts' (same 32-node SU, NDR 400 Gb/s InfiniBand)")
_ALFARES = "Al-Fares, Loukissas, Vahdat, 'A Scalable, Commodity Data Center Network Architecture', SIGCOMM 2008"
_LLAMA3 = "Llama Team, 'The Llama 3 Herd of Models', arXiv:2407.21783, section 3.3.1 (network)"

_H100 = hardware.spec("H100-SXM")

PUBLISHED: dict[str, Published] = {
    "quantum2_ports": Published(64, "ports per switch", _QM9700),
    "quantum2_port_gbit_per_s": Published(400, "Gb/s per port (NDR)", _QM9700),
    "spectrum4_ports_800g": Published(64, "ports of 800GbE per switch", _SN5600),
    "spectrum4_ports_400g": Published(128, "ports of 400GbE per switch", _SN5600),
    "h100_nvlink_links": Published(18, "NVLink 4 links per GPU", _H100_WP),
    "h100_nvlink_bytes_per_s": Published(_H100.nvlink_bandwidth, "bytes/s per GPU, both directions together",
                                         next(s for s in _H100.sources if "NVLink" in s)),
    "dgx_h100_gpus": memory_hierarchy.PUBLISHED["H100-SXM"]["gpus_per_node"],
    "dgx_h100_nvswitches": Published(4, "NVSwitch chips per node", _DGX_UG),
    "dgx_h100_compute_nics": Published(8, "ConnectX-7 ports for the compute fabric per node", _DGX_UG),
    "connectx7_gbit_per_s": Published(400, "Gb/s per port, each direction", _DGX_UG),
    "superpod_su_nodes": Published(32, "DGX H100 nodes per scalable unit (SU)", _RA_H100),
    "fat_tree_k48_hosts": Published(27_648, "hosts of a fat tree of 48-port switches", _ALFARES),
    "llama3_pod_gpus": Published(3_072, "GPUs per full-bisection pod", _LLAMA3),
    "llama3_cluster_gpus": Published(24_576, "GPUs per cluster (8 pods; the paper says '24K')", _LLAMA3),
    "llama3_pod_oversubscription": Published(7, "oversubscription between pods (1:7)", _LLAMA3),
}
"""Published hardware and topology figures the book quotes, each with its primary source."""

SUPERPOD_COMPUTE_FABRIC: dict[int, dict] = {
    # SU count: GPU ports the fabric is built for (32 nodes x 8 per SU), switches, leaf-spine(-core) cables.
    1: dict(gpu_ports=256, leaf=8, spine=4, core=0, leaf_spine_cables=256, source=_RA_H100),
    2: dict(gpu_ports=512, leaf=16, spine=8, core=0, leaf_spine_cables=512, source=_RA_H100),
    3: dict(gpu_ports=768, leaf=24, spine=16, core=0, leaf_spine_cables=768, source=_RA_H100),
    4: dict(gpu_ports=1024, leaf=32, spine=16, core=0, leaf_spine_cables=1024, source=_RA_H100),
    8: dict(gpu_ports=2048, leaf=64, spine=32, core=0, leaf_spine_cables=2048, source=_RA_B200),
    16: dict(gpu_ports=4096, leaf=128, spine=128, core=64, leaf_spine_cables=4096, source=_RA_B200),
    32: dict(gpu_ports=8192, leaf=256, spine=256, core=128, leaf_spine_cables=8192, source=_RA_B200),
    64: dict(gpu_ports=16384, leaf=512, spine=512, core=256, leaf_spine_cables=16384, source=_RA_B200),
}
"""Compute-fabric switch and cable counts of DGX SuperPODs of 64-port NDR switches, by SU count.

The H100 table lists 31 nodes per SU (one slot is given to the fabric manager)
but says the fabric is built for the full SU, so ``gpu_ports`` is 256 per SU.
"""


def _check_radix(radix: int) -> None:
    if not isinstance(radix, int) or isinstance(radix, bool) or radix < 2 or radix % 2:
        raise ValueError(f"radix (ports per switch) must be an even int >= 2, got {radix!r}")


def _check_tiers(tiers: int, allowed: tuple[int, ...] = (1, 2, 3)) -> None:
    if not isinstance(tiers, int) or isinstance(tiers, bool) or tiers not in allowed:
        raise ValueError(f"tiers must be one of {allowed}, got {tiers!r}")


# --- Direct wiring and the closed forms of the fat tree ---------------------------------------------------


def full_mesh_links(n: int) -> int:
    """Cables to wire ``n`` nodes each directly to every other: ``n (n - 1) / 2``."""
    check_positive_int("n", n)
    return n * (n - 1) // 2


def full_mesh_ports_per_node(n: int) -> int:
    """Ports each node needs in a full mesh of ``n`` nodes: ``n - 1``."""
    check_positive_int("n", n)
    return n - 1


def worst_case_hops(tiers: int) -> int:
    """Switches on the longest shortest path between two hosts of a ``tiers``-tier Clos: ``2 tiers - 1``.

    Up to the top tier and back down: 1 (one switch), 3 (leaf-spine-leaf),
    5 (leaf-spine-core-spine-leaf).
    """
    check_positive_int("tiers", tiers)
    return 2 * tiers - 1


def fat_tree_max_hosts(radix: int, tiers: int) -> int:
    """Hosts of a non-blocking ``tiers``-tier fat tree of radix-``k`` switches: ``2 (k/2)^tiers``.

    ``k`` for one switch, ``k^2/2`` for leaf-spine, ``k^3/4`` for three tiers
    (Al-Fares et al., SIGCOMM 2008: k = 48 gives 27,648 hosts).
    """
    _check_radix(radix)
    check_positive_int("tiers", tiers)
    return 2 * (radix // 2) ** tiers


def fat_tree_switches(radix: int, tiers: int) -> int:
    """Switches of a full non-blocking ``tiers``-tier fat tree: ``(2 tiers - 1) (k/2)^(tiers - 1)``.

    1, ``3k/2`` and ``5k^2/4`` for one, two and three tiers (Al-Fares et al.,
    SIGCOMM 2008, section 3: k pods of k/2 edge and k/2 aggregation switches, plus (k/2)^2 cores).
    """
    _check_radix(radix)
    check_positive_int("tiers", tiers)
    return (2 * tiers - 1) * (radix // 2) ** (tiers - 1)


def leaf_ports(radix: int, oversubscription: float = 1.0) -> tuple[int, int]:
    """Split a leaf's ``radix`` ports into (downlinks to hosts, uplinks to spines).

    Oversubscription ``r`` is the ratio downlinks : uplinks, so
    ``down = floor(k r / (r + 1))`` and ``up = k - down`` (``r = 1``: half and half).
    """
    _check_radix(radix)
    check_positive("oversubscription (downlinks : uplinks)", oversubscription, finite=True)
    down = math.floor(radix * oversubscription / (oversubscription + 1) + 1e-9)
    up = radix - down
    if down < 1 or up < 1:
        raise ValueError(f"oversubscription {oversubscription} leaves a radix-{radix} leaf with {down} "
                         f"downlinks and {up} uplinks; each needs at least one")
    return down, up


def max_hosts(radix: int, tiers: int, oversubscription: float = 1.0) -> int:
    """Most hosts a ``tiers``-tier fabric of radix-``k`` switches connects, oversubscribed ``r`` at the leaves.

    With ``d`` leaf downlinks (:func:`leaf_ports`): ``k`` for one tier, ``k d``
    for two (each of up to ``k`` leaves reaches every spine), ``k (k/2) d`` for
    three (up to ``k`` pods of ``k/2`` leaves). At ``r = 1`` this is
    :func:`fat_tree_max_hosts`.
    """
    _check_tiers(tiers)
    if tiers == 1:
        _check_radix(radix)
        return radix
    down, _ = leaf_ports(radix, oversubscription)
    return radix * down if tiers == 2 else radix * (radix // 2) * down


# --- Building a fabric for a given number of hosts --------------------------------------------------------


@dataclass(frozen=True)
class Fabric:
    """A folded-Clos fabric sized for ``n_hosts`` host ports. Build one with :func:`clos`.

    ``switches_per_tier`` and ``links_per_tier`` run bottom-up: (leaf, spine,
    core) switches, and (host-leaf, leaf-spine, spine-core) cables. Parallel
    cables between the same two switches count one each.
    """

    n_hosts: int
    radix: int
    tiers: int
    hosts_per_leaf: int
    uplinks_per_leaf: int
    pods: int
    switches_per_tier: tuple[int, ...]
    links_per_tier: tuple[int, ...]
    worst_case_hops: int
    max_hosts: int

    @property
    def switches(self) -> int:
        """Switches in all tiers."""
        return sum(self.switches_per_tier)

    @property
    def cables(self) -> int:
        """Cables in all tiers, host cables included."""
        return sum(self.links_per_tier)

    @property
    def oversubscription(self) -> float:
        """Leaf downlinks : uplinks as built (1.0 for a single switch)."""
        return self.hosts_per_leaf / self.uplinks_per_leaf if self.uplinks_per_leaf else 1.0


def _smallest_divisor_at_least(n: int, lower: int) -> int:
    """The smallest divisor of ``n`` that is >= ``lower`` (``n`` itself if none is smaller)."""
    for d in range(max(1, lower), n + 1):
        if n % d == 0:
            return d
    raise ValueError(f"no divisor of {n} is >= {lower}")


def _check_fits(n_hosts: int, radix: int, tiers: int, oversubscription: float) -> int:
    check_positive_int("n_hosts", n_hosts)
    limit = max_hosts(radix, tiers, oversubscription)
    if n_hosts > limit:
        raise ValueError(
            f"{n_hosts} hosts do not fit in {tiers} tier(s) of radix-{radix} switches at oversubscription "
            f"{oversubscription:g} (at most {limit}); add a tier, use a larger radix or oversubscribe more")
    return limit


def single_switch(n_hosts: int, radix: int) -> Fabric:
    """One switch: up to ``radix`` hosts, each one hop from every other."""
    _check_radix(radix)
    limit = _check_fits(n_hosts, radix, 1, 1.0)
    return Fabric(n_hosts, radix, 1, n_hosts, 0, 1, (1,), (n_hosts,), 1, limit)


def leaf_spine(n_hosts: int, radix: int, oversubscription: float = 1.0) -> Fabric:
    """A two-tier leaf-spine (folded Clos) fabric for ``n_hosts`` hosts of radix-``k`` switches.

    Each leaf takes ``d`` hosts and has ``u`` uplinks (:func:`leaf_ports`), so
    ``L = ceil(n_hosts / d)`` leaves. Every leaf reaches every spine with the
    same number of parallel cables, so the spine count ``S`` is the smallest
    divisor of ``u`` with ``S k >= L u``. This reproduces the DGX SuperPOD
    compute-fabric table (:data:`SUPERPOD_COMPUTE_FABRIC`), e.g. 16 spines for
    3 SUs. At ``r = 1`` and ``n_hosts = k^2/2``: ``k`` leaves and ``k/2`` spines.
    Cables: ``n_hosts`` host cables plus ``L u`` leaf-spine cables. Worst case 3 switch hops.
    """
    limit = _check_fits(n_hosts, radix, 2, oversubscription)
    down, up = leaf_ports(radix, oversubscription)
    leaves = -(-n_hosts // down)
    spines = _smallest_divisor_at_least(up, -(-leaves * up // radix))
    hops = 3 if leaves > 1 else 1
    return Fabric(n_hosts, radix, 2, down, up, 1, (leaves, spines), (n_hosts, leaves * up), hops, limit)


def fat_tree(n_hosts: int, radix: int, oversubscription: float = 1.0) -> Fabric:
    """A three-tier fat tree (leaf, spine, core) for ``n_hosts`` hosts of radix-``k`` switches.

    As Al-Fares et al. (SIGCOMM 2008) with oversubscription allowed at the
    leaves only: a pod is ``k/2`` leaves and ``u`` spines (each leaf reaches
    each spine of its pod once; each spine has ``k/2`` ports down and ``k/2``
    up). ``P = ceil(L / (k/2))`` pods. Spine ``j`` of every pod reaches the
    same group of ``c`` cores, ``c`` the smallest divisor of ``k/2`` with
    ``c >= P/2``, so ``u c`` cores. At ``r = 1`` and ``n_hosts = k^3/4`` this is
    ``k`` pods, ``k^2`` leaves and spines and ``(k/2)^2`` cores: ``5k^2/4`` switches.
    Worst case 5 switch hops.
    """
    limit = _check_fits(n_hosts, radix, 3, oversubscription)
    down, up = leaf_ports(radix, oversubscription)
    half = radix // 2
    leaves = -(-n_hosts // down)
    pods = -(-leaves // half)
    spines = pods * up
    group = _smallest_divisor_at_least(half, -(-pods // 2))
    cores = up * group
    hops = 5 if pods > 1 else (3 if leaves > 1 else 1)
    return Fabric(n_hosts, radix, 3, down, up, pods, (leaves, spines, cores),
                  (n_hosts, leaves * up, spines * half), hops, limit)


def clos(n_hosts: int, radix: int, tiers: int, oversubscription: float = 1.0) -> Fabric:
    """The ``tiers``-tier fabric for ``n_hosts`` hosts: :func:`single_switch`, :func:`leaf_spine` or :func:`fat_tree`.

    Raises ``ValueError`` if the hosts do not fit (compare with :func:`max_hosts` first).
    """
    _check_tiers(tiers)
    if tiers == 1:
        return single_switch(n_hosts, radix)
    if tiers == 2:
        return leaf_spine(n_hosts, radix, oversubscription)
    return fat_tree(n_hosts, radix, oversubscription)


def min_tiers(n_hosts: int, radix: int, oversubscription: float = 1.0) -> int:
    """The fewest tiers (1, 2 or 3) whose fabric fits ``n_hosts`` hosts; ``ValueError`` if even 3 do not."""
    check_positive_int("n_hosts", n_hosts)
    for tiers in (1, 2, 3):
        if n_hosts <= max_hosts(radix, tiers, oversubscription):
            return tiers
    raise ValueError(f"{n_hosts} hosts need more than 3 tiers of radix-{radix} switches "
                     f"(3 tiers hold {max_hosts(radix, 3, oversubscription)}); use a larger radix")
