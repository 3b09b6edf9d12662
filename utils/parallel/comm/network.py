"""Cost models of collective communication: how long an all-reduce takes.

The alpha-beta model prices one message of ``n`` bytes over a link as
``alpha + n / B``: a fixed latency ``alpha`` (seconds) plus the bytes over the
bandwidth ``B`` (bytes/s). Collective algorithms are priced by counting their
steps and the bytes each step sends (Thakur, Rabenseifner and Gropp,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 2005).

Here: the ring (:func:`ring_allreduce_time`) and the other all-reduce
algorithms it is compared with (naive, direct, binomial tree, double binary
tree; all in :data:`ALLREDUCE_COST_MODELS`), the bandwidth lower bound when
the GPUs do the additions, the all-reduce whose additions the switches do
(:func:`in_network_allreduce_time`: SHARP, NVLink SHARP), and
all-reduce across two levels, NVLink inside a node and a scale-out fabric
between nodes (:func:`hierarchical_allreduce_time`,
:func:`flat_ring_allreduce_time`). The algorithm and bus bandwidths that
nccl-tests reports are in :mod:`utils.parallel.comm.bandwidth`. These models are
ideal (line rate, small per-step latency); what NCCL reaches on one NVLink
domain, calibrated on published nccl-tests figures, is
:mod:`utils.parallel.comm.nccl_allreduce`.
Bandwidths are in bytes/s, latencies and times in seconds, sizes in bytes.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Callable, Mapping

from utils.validate import check_nonnegative, check_positive, check_positive_int


def _check_collective_args(n: int, nbytes: float, bandwidth: float, latency: float) -> None:
    check_positive_int("n (the number of GPUs)", n)
    check_nonnegative("nbytes", nbytes)
    check_positive("bandwidth (bytes/s)", bandwidth)
    check_nonnegative("latency (seconds)", latency)


def ring_allreduce_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` per GPU over ``n`` GPUs.

    ``2(n-1) * latency + 2(n-1)/n * nbytes / bandwidth``: a reduce-scatter and an
    all-gather, each ``n - 1`` steps that send one ``nbytes / n`` chunk
    (Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters
    of workstations", JPDC 2009). ``bandwidth`` is each GPU's send bandwidth in
    bytes/s, ``latency`` the per-step latency in seconds. One GPU needs no time.
    The ideal ring (the planner's): NCCL's measured rings reach about 82 % of the
    NVLink line rate and pay tens of microseconds per call, which
    :func:`utils.parallel.comm.nccl_allreduce.nccl_allreduce_time` adds.
    """
    _check_collective_args(n, nbytes, bandwidth, latency)
    if n == 1:
        return 0.0
    return 2 * (n - 1) * latency + 2 * (n - 1) / n * nbytes / bandwidth


# --- Other all-reduce algorithms, in the same alpha-beta model --------------------------------------------
#
# Every model below prices a message of m bytes at ``latency + m / bandwidth`` and lets each GPU send one
# message and receive one message at a time (full-duplex links). The local additions of a reduction are
# left out: a GPU adds numbers far faster than a link delivers them.


def _log2_ceil(n: int) -> int:
    """Rounds of a binary tree over ``n`` nodes: ``ceil(log2 n)`` (0 for one node)."""
    return (n - 1).bit_length()


def naive_allreduce_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds for an all-reduce through a root: everyone sends to GPU 0, which sends the sum back.

    ``2(n-1) * (latency + nbytes / bandwidth)``: the root receives ``n - 1``
    whole buffers one after the other (a reduce), then sends the result ``n - 1``
    times (a broadcast). Its link carries ``2(n-1)`` buffers while the others
    idle, so the time grows linearly with ``n``. The simplest scheme, and a
    baseline for the others.
    """
    _check_collective_args(n, nbytes, bandwidth, latency)
    return 2 * (n - 1) * (latency + nbytes / bandwidth)


def direct_allreduce_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds for an all-reduce in which every GPU sends its whole buffer to every other GPU.

    ``(n-1) * (latency + nbytes / bandwidth)``: each GPU sends ``n - 1`` whole
    buffers (and receives as many on the other direction of its link), then
    adds what it received. No root bottleneck, but each link still carries
    ``(n-1)`` buffers, against less than 2 for the ring.
    """
    _check_collective_args(n, nbytes, bandwidth, latency)
    return (n - 1) * (latency + nbytes / bandwidth)


def tree_allreduce_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds for a binomial-tree reduce to one GPU followed by a binomial-tree broadcast.

    ``2 ceil(log2 n) * (latency + nbytes / bandwidth)``: each of the
    ``ceil(log2 n)`` rounds of the reduce halves the number of GPUs holding
    partial sums, each sending its whole buffer; the broadcast mirrors it
    (the binomial-tree reduce and broadcast costs of Thakur, Rabenseifner and
    Gropp, "Optimization of Collective Communication Operations in MPICH",
    IJHPCA 2005). Latency grows only as ``log n``, but every round moves the
    whole buffer.
    """
    _check_collective_args(n, nbytes, bandwidth, latency)
    return 2 * _log2_ceil(n) * (latency + nbytes / bandwidth)


def double_binary_tree_pipeline_blocks(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """The number ``k`` of pipeline blocks per tree that minimises :func:`double_binary_tree_allreduce_time`.

    ``k* = sqrt(L * nbytes / (2 * latency * bandwidth))`` with ``L = ceil(log2 n)``,
    at least 1 (the optimum of the step count in :func:`double_binary_tree_allreduce_time`,
    which follows a secondary summary of Sanders, Speck and Träff 2009). Infinite when ``latency`` is 0.
    """
    _check_collective_args(n, nbytes, bandwidth, latency)
    depth = _log2_ceil(n)
    if latency == 0:
        return float("inf")
    return max(1.0, (depth * nbytes / (2 * latency * bandwidth)) ** 0.5)


def double_binary_tree_allreduce_time(n: int, nbytes: float, bandwidth: float, latency: float,
                                      blocks: float | None = None) -> float:
    """Seconds for a pipelined two-tree (double binary tree) reduce followed by a broadcast.

    Two binary trees span the ``n`` GPUs; every GPU is an inner node of at most
    one of them, so each tree carries half the buffer at the full link
    bandwidth (Sanders, Speck and Träff, "Two-tree algorithms for full bandwidth
    broadcast, reduction and scan", Parallel Computing 35(12), 2009; used by
    NCCL since 2.4: Jeaugey, "Massively Scale Your Deep Learning Training with
    NCCL 2.4", NVIDIA Technical Blog, 2019). Each half is cut into ``k`` blocks
    and pipelined; a reduce takes about ``2(L + k)`` steps of one
    ``nbytes / (2k)``-byte block, ``L = ceil(log2 n)``, and the broadcast as many
    again. (This step count, and the optimal ``k`` below, are as summarised in
    Wikipedia's "Two-tree broadcast" article, which cites Sanders et al.; they
    were not checked against the paper itself. A model: NCCL overlaps the two
    phases and its real trees have their own constants.)

    ``2 * 2(L + k) * (latency + nbytes / (2 k bandwidth))``.

    With the best ``k`` (:func:`double_binary_tree_pipeline_blocks`, the default
    when ``blocks`` is None) one phase is ``(sqrt(nbytes / bandwidth) + sqrt(2 L latency))**2``:
    bandwidth term ``nbytes / bandwidth`` like a single message, latency term
    growing only as ``log n``. Large buffers pay about 2 ``nbytes / bandwidth``
    in all, slightly more than the ring's ``2(n-1)/n``; small ones far less latency.
    """
    _check_collective_args(n, nbytes, bandwidth, latency)
    if n == 1:
        return 0.0
    depth = _log2_ceil(n)
    if blocks is None:
        blocks = double_binary_tree_pipeline_blocks(n, nbytes, bandwidth, latency)
    elif not blocks >= 1:
        raise ValueError(f"blocks (pipeline blocks per tree) must be >= 1, got {blocks!r}")
    if blocks == float("inf"):  # no latency: infinitely fine pipelining, the bandwidth term alone
        return 2 * nbytes / bandwidth
    return 2 * 2 * (depth + blocks) * (latency + nbytes / (2 * blocks * bandwidth))


def allreduce_lower_bound_time(n: int, nbytes: float, bandwidth: float) -> float:
    """The least time an all-reduce of ``nbytes`` per GPU can take when the GPUs do the additions.

    ``2(n-1)/n * nbytes / bandwidth``: if only GPUs add, every GPU must send and
    receive at least ``2(n-1)/n`` times its buffer (Patarasuk and Yuan, JPDC
    2009; the same argument gives the all-reduce bus-bandwidth factor of
    nccl-tests, doc/PERFORMANCE.md). The ring reaches it when latency is 0.
    The assumption matters: switches that add (:func:`in_network_allreduce_time`)
    need each GPU to send and receive only about ``nbytes``.
    """
    _check_collective_args(n, nbytes, bandwidth, 0.0)
    return 2 * (n - 1) / n * nbytes / bandwidth


def in_network_allreduce_time(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds for an all-reduce whose additions are done by the switch, not by the GPUs.

    ``2 * latency + nbytes / bandwidth``: each GPU sends its buffer once, up to
    the switch, which adds the ``n`` contributions as they arrive, and receives
    the sum once, multicast back down; pipelined in chunks, the two directions
    of its link carry ``nbytes`` each at the same time. That is SHARP on
    InfiniBand switches (NVIDIA SHARP documentation: collectives offloaded to
    the switch network, "eliminating the need to send data multiple times
    between endpoints") and NVLink SHARP (NVLS) on the third-generation
    NVSwitch of the H100 generation (NVIDIA H100 Tensor Core GPU Architecture
    whitepaper, 2022; NCCL 2.17+ algorithm NVLS). Against the ring's
    ``2(n-1)/n * nbytes / bandwidth`` it is ``2(n-1)/n`` times faster for large
    buffers, approaching 2. That is the ideal, a bound: NCCL's NVLS all-reduce
    moves ``(n+1)/n * nbytes`` each way (a switch reduce-scatter, then a switch
    all-gather) at about 0.69 of the line rate, and reaches a busbw of ~480 GB/s
    on 8 H100s, about 1.07x the 450 GB/s link and 1.3x NCCL's ring, not 1.75x
    (S. Jeaugey, NVIDIA/nccl-tests issue 212). For what NCCL reaches use
    :func:`utils.parallel.comm.nccl_allreduce.nccl_allreduce_time`. One latency
    up and one down is the model of a single switch level. One GPU needs no time.
    """
    _check_collective_args(n, nbytes, bandwidth, latency)
    if n == 1:
        return 0.0
    return 2 * latency + nbytes / bandwidth


ALLREDUCE_COST_MODELS: Mapping[str, Callable[[int, float, float, float], float]] = MappingProxyType({
    "naive (through a root)": naive_allreduce_time,
    "direct (all to all)": direct_allreduce_time,
    "binomial tree": tree_allreduce_time,
    "double binary tree": double_binary_tree_allreduce_time,
    "ring": ring_allreduce_time,
})
"""The all-reduce cost models of this module by name, each ``f(n, nbytes, bandwidth, latency) -> seconds``."""


# --- All-reduce across two levels: NVLink inside nodes, scale-out between them ----------------------------


def _check_two_level(nbytes: float, gpus_per_node: int, n_nodes: int, intra_bandwidth: float,
                     intra_latency: float, inter_bandwidth: float, inter_latency: float) -> None:
    check_positive_int("gpus_per_node", gpus_per_node)
    check_positive_int("n_nodes", n_nodes)
    check_nonnegative("nbytes", nbytes)
    check_positive("intra_bandwidth (bytes/s)", intra_bandwidth)
    check_positive("inter_bandwidth (bytes/s)", inter_bandwidth)
    check_nonnegative("intra_latency (seconds)", intra_latency)
    check_nonnegative("inter_latency (seconds)", inter_latency)


def hierarchical_allreduce_time(nbytes: float, gpus_per_node: int, n_nodes: int,
                                intra_bandwidth: float, intra_latency: float,
                                inter_bandwidth: float, inter_latency: float) -> float:
    """Seconds for a two-level all-reduce of ``nbytes`` per GPU over ``n_nodes`` nodes of ``gpus_per_node`` GPUs.

    1. reduce-scatter inside each node (ring over NVLink): each GPU ends with
       the node's sum of one ``1/g`` shard;
    2. all-reduce of that shard (``nbytes / g``) across nodes, among the GPUs
       of equal local rank, each through its own NIC;
    3. all-gather inside each node.

    Steps 1 and 3 together cost one intra-node ring all-reduce, so with
    :func:`ring_allreduce_time` (phases run one after the other, no overlap):
    ``ring(g, nbytes, B_intra, a_intra) + ring(N, nbytes / g, B_inter, a_inter)``.
    Bandwidths are each GPU's send bandwidth in bytes/s (one direction).
    """
    _check_two_level(nbytes, gpus_per_node, n_nodes, intra_bandwidth, intra_latency,
                     inter_bandwidth, inter_latency)
    inside = ring_allreduce_time(gpus_per_node, nbytes, intra_bandwidth, intra_latency)
    across = ring_allreduce_time(n_nodes, nbytes / gpus_per_node, inter_bandwidth, inter_latency)
    return inside + across


def flat_ring_allreduce_time(nbytes: float, gpus_per_node: int, n_nodes: int,
                             intra_bandwidth: float, intra_latency: float,
                             inter_bandwidth: float, inter_latency: float, rings: int = 1) -> float:
    """Seconds for a flat ring all-reduce over all ``g N`` GPUs, ordered node by node.

    The data is split over ``rings`` parallel rings (1 <= rings <= g), each
    leaving every node through its own NIC. A ring step moves one chunk
    ``c = nbytes / (rings g N)`` over every hop at once and lasts as long as its
    slowest hop: ``max(a_intra + c rings / B_intra, a_inter + c / B_inter)``
    (the NVLink bandwidth of a GPU is shared by its rings). The ring takes
    ``2 (g N - 1)`` steps, as in :func:`ring_allreduce_time`,
    which this equals when ``N = 1`` or when one ring is paced by the
    inter-node link. Bandwidths are per GPU, one direction, in bytes/s.
    """
    _check_two_level(nbytes, gpus_per_node, n_nodes, intra_bandwidth, intra_latency,
                     inter_bandwidth, inter_latency)
    if not isinstance(rings, int) or isinstance(rings, bool) or not 1 <= rings <= gpus_per_node:
        raise ValueError(f"rings must be an int from 1 to gpus_per_node={gpus_per_node} "
                         f"(one NIC per GPU), got {rings!r}")
    n = gpus_per_node * n_nodes
    if n == 1:
        return 0.0
    chunk = nbytes / (rings * n)
    step = intra_latency + chunk * rings / intra_bandwidth if gpus_per_node > 1 else 0.0
    if n_nodes > 1:
        step = max(step, inter_latency + chunk / inter_bandwidth)
    return 2 * (n - 1) * step
