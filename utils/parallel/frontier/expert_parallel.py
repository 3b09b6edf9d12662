"""Expert parallelism: the experts of an MoE layer split over ranks, tokens moved by two all-to-alls.

Each of ``P`` ranks holds ``E / P`` experts (rank ``r`` experts
``[r E/P, (r+1) E/P)``), a copy of the router and of the shared experts, and
its own ``T`` tokens. A forward (GShard, arXiv:2006.16668, §2.2 and Algorithm 1):

1. route the local tokens and lay them out as ``(E, C, h)``, ``C`` the
   capacity of :func:`utils.parallel.frontier.moe.expert_capacity` for ``T``
   tokens (padding where an expert got fewer);
2. **dispatch**: ``all_to_all_single`` sends chunk ``p`` (the ``E/P`` experts of
   rank ``p``) to rank ``p``; each rank receives ``(P, E/P, C, h)``;
3. each local expert runs on its ``P C`` rows;
4. **combine**: a second ``all_to_all_single`` sends every result back to the
   rank its token came from, which weights and sums them.

The all-to-all's backward is an all-to-all (:class:`AllToAll`). With equal
chunks every rank sends ``(P-1)/P * E C h`` elements to other ranks per
all-to-all (:func:`all_to_all_bytes`): about ``capacity_factor * k * h`` elements
per token, twice per forward and twice per backward. The layer equals
:class:`~utils.parallel.frontier.moe.MoELayer` run with ``groups=P`` on all the
tokens (each group, like each rank, routes with its own capacity).
Pricing: :func:`all_to_all_seconds`, the pairwise exchange in the alpha-beta
model of :mod:`utils.parallel.comm.network`. DeepSeek-V3's node-limited routing
(:func:`node_limited_route`) caps the nodes a token's experts may sit on, and
:func:`node_limited_all_to_all_bytes` counts what the cap saves on the network;
:data:`PUBLISHED` holds its run's figures.
"""

from __future__ import annotations

import copy
from types import MappingProxyType
from typing import Mapping

import torch
import torch.distributed as dist
from torch import nn

from utils.parallel.frontier.moe import MoELayer, combine, dispatch, expert_capacity
from utils.published import Published
from utils.validate import check_element_size, check_nonnegative, check_positive, check_positive_int


_DSV3 = "DeepSeek-AI, DeepSeek-V3 Technical Report, arXiv:2412.19437"
PUBLISHED: Mapping[str, Published] = MappingProxyType({
    "deepseek_v3_nvlink_bytes_per_s": Published(160e9, "bytes/s per GPU (NVLink, H800)", _DSV3 + ", §3.2.2"),
    "deepseek_v3_ib_bytes_per_s": Published(50e9, "bytes/s per GPU (InfiniBand)", _DSV3 + ", §3.2.2"),
    "deepseek_v3_max_nodes_per_token": Published(4, "nodes a token's routed experts may span",
                                                 _DSV3 + ", §2.1.2 (the rule), §3.2.2 and §4.2 (M = 4)"),
    "deepseek_v3_expert_parallel": Published(64, "GPUs per expert-parallel group (8 nodes)", _DSV3 + ", §3.2"),
    "deepseek_v3_comm_sms": Published(20, "of 132 SMs per H800 kept for communication", _DSV3 + ", §3.2.2"),
})
"""DeepSeek-V3's interconnect and expert-parallel layout, as its report states them."""


def node_limited_route(scores: torch.Tensor, top_k: int, experts_per_node: int, max_nodes: int) -> torch.Tensor:
    """``(tokens, top_k)`` experts chosen among those of at most ``max_nodes`` nodes (DeepSeek-V3 §2.1.2).

    Experts ``[n g, (n + 1) g)`` sit on node ``n`` (``g = experts_per_node``).
    A node's score for a token is the sum of its ``top_k / max_nodes`` highest
    expert scores; the ``max_nodes`` best nodes are kept and the top-k experts
    chosen among theirs. DeepSeek-V3's inference code does the same with the
    top 2 per group (``n_limited_groups = 4`` of 8 groups, 8 experts of 256).
    """
    if scores.dim() != 2 or scores.shape[1] % experts_per_node:
        raise ValueError(f"scores must be (tokens, n_experts) with n_experts divisible by experts_per_node="
                         f"{experts_per_node}, got {tuple(scores.shape)}")
    n_nodes = scores.shape[1] // experts_per_node
    check_positive_int("max_nodes", max_nodes)
    if max_nodes > n_nodes or top_k % max_nodes or top_k // max_nodes > experts_per_node or top_k > max_nodes * experts_per_node:
        raise ValueError(f"need max_nodes <= {n_nodes} nodes and top_k ({top_k}) a multiple of max_nodes "
                         f"({max_nodes}) with top_k / max_nodes <= experts_per_node ({experts_per_node})")
    per_node = scores.view(scores.shape[0], n_nodes, experts_per_node)
    node_score = per_node.topk(top_k // max_nodes, dim=-1).values.sum(-1)
    keep = torch.zeros_like(node_score, dtype=torch.bool).scatter_(1, node_score.topk(max_nodes, dim=-1).indices, True)
    masked = per_node.masked_fill(~keep.unsqueeze(-1), float("-inf")).flatten(1)
    return masked.topk(top_k, dim=-1).indices


class AllToAll(torch.autograd.Function):
    """All-to-all with equal chunks along dim 0 in forward, the same all-to-all of the gradient in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad.contiguous(), group=ctx.group)
        return out, None


def all_to_all(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Chunk ``p`` of ``x`` (split along dim 0 into ``P`` equal chunks) goes to rank ``p``; differentiable."""
    world = dist.get_world_size(group)
    if x.shape[0] % world:
        raise ValueError(f"dim 0 of x ({x.shape[0]}) must be divisible by the group size {world}")
    return AllToAll.apply(x, group)


def all_to_all_bytes(tokens: int, hidden: int, n_experts: int, top_k: int, capacity_factor: float | None,
                     world_size: int, element_size: int = 2) -> int:
    """Bytes one rank sends to other ranks in one dispatch (or one combine) all-to-all of this module.

    ``(P-1)/P * E * C * h * element_size`` with ``C = expert_capacity(tokens, E, k, capacity_factor)``:
    the whole padded ``(E, C, h)`` buffer leaves, except the chunk for the
    rank's own experts. For large ``T``, ``C ~ capacity_factor T k / E`` and
    this is ``(P-1)/P * capacity_factor * k * h * element_size`` bytes per token.
    """
    check_positive_int("world_size", world_size)
    check_positive_int("hidden", hidden)
    check_element_size(element_size)
    if n_experts % world_size:
        raise ValueError(f"n_experts ({n_experts}) must be divisible by world_size ({world_size})")
    capacity = expert_capacity(tokens, n_experts, top_k, capacity_factor)
    return (world_size - 1) * (n_experts // world_size) * capacity * hidden * element_size


def node_limited_all_to_all_bytes(tokens: int, hidden: int, top_k: int, world_size: int, ranks_per_node: int,
                                  max_nodes: int, element_size: int = 2) -> tuple[float, float]:
    """``(network, nvlink)`` bytes one rank sends in one dispatch (or combine) under node-limited routing.

    The ``P = world_size`` ranks fill ``n = P / g`` nodes, ``g = ranks_per_node`` on each.
    Each token is routed to at most ``M = max_nodes`` nodes (DeepSeek-V3, §2.1.2;
    :func:`node_limited_route`), counted as the most it can visit, ``min(M, k, n)``
    (its ``k`` experts cannot span more nodes than ``k`` or ``n``). It crosses the
    network once per *remote* node, to the GPU with the same in-node index, which
    forwards it over NVLink to the GPUs of its experts (§3.2.2); with the nodes
    equally likely, ``1/n`` of the visits are to the sender's own node. So
    ``network = T min(M, k, n) (n - 1)/n h e`` and, each of the ``k`` copies
    landing on another GPU of its node with probability ``(g - 1)/g``,
    ``nvlink = T k (g - 1)/g h e`` (``T = tokens``, ``e = element_size``).
    With ``M >= min(k, n)`` the cap does not bind, but a node still receives a
    token once, not once per expert as in :func:`all_to_all_bytes`. The combine
    retraces the same paths.
    """
    for name, value in (("tokens", tokens), ("hidden", hidden), ("top_k", top_k), ("world_size", world_size),
                        ("ranks_per_node", ranks_per_node), ("max_nodes", max_nodes)):
        check_positive_int(name, value)
    check_element_size(element_size)
    if world_size % ranks_per_node:
        raise ValueError(f"world_size ({world_size}) must fill whole nodes of ranks_per_node={ranks_per_node}")
    n = world_size // ranks_per_node
    network = tokens * min(max_nodes, top_k, n) * (n - 1) / n * hidden * element_size
    nvlink = tokens * top_k * (ranks_per_node - 1) / ranks_per_node * hidden * element_size
    return network, nvlink


def all_to_all_seconds(world_size: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds for an all-to-all in which each rank sends ``nbytes`` in all to the other ``P - 1`` ranks.

    Pairwise exchange: ``P - 1`` steps, each sending ``nbytes / (P-1)`` to one
    peer while receiving as much, ``(P-1) * latency + nbytes / bandwidth``
    (Thakur, Rabenseifner and Gropp, IJHPCA 2005, §3.4, with ``nbytes`` the
    bytes that leave the rank). ``bandwidth`` is each rank's send bandwidth in
    bytes/s; one rank needs no time.
    """
    check_positive_int("world_size", world_size)
    check_nonnegative("nbytes", nbytes)
    check_positive("bandwidth (bytes/s)", bandwidth)
    check_nonnegative("latency (seconds)", latency)
    if world_size == 1:
        return 0.0
    return (world_size - 1) * latency + nbytes / bandwidth


class ExpertParallelMoE(nn.Module):
    """This rank's part of ``layer``: its ``E / P`` experts, and copies of the router and the shared experts.

    ``forward(x)`` takes this rank's ``(tokens, hidden)`` and returns its
    output. The router's and the shared experts' gradients are partial sums:
    all-reduce them (as data parallelism would) to get the one-process
    gradients. After a call, ``last_bytes`` holds what each all-to-all sent to
    other ranks (``"dispatch"``, ``"combine"``; padding included) and
    ``last_token_bytes`` the bytes of the real (kept, not padding) tokens among them.
    """

    def __init__(self, layer: MoELayer, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        if not isinstance(layer, MoELayer):
            raise ValueError(f"layer must be a utils.parallel.frontier.moe.MoELayer, got {type(layer).__name__}")
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        if layer.n_experts % self.world:
            raise ValueError(f"n_experts ({layer.n_experts}) must be divisible by the group size {self.world}")
        self.local = layer.n_experts // self.world
        first = self.rank * self.local
        self.layer = copy.deepcopy(layer)  # router, bias buffer and shared experts replicated
        self.layer.experts = nn.ModuleList(self.layer.experts[first:first + self.local])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer, world, local = self.layer, self.world, self.local
        layer.check_input(x)
        weights, experts, positions, capacity, logits = layer.assign(x)
        send = dispatch(x, experts, positions, layer.n_experts, capacity)  # (E, C, h), chunk p for rank p
        received = all_to_all(send, self.group).view(world, local, capacity, -1)  # (P, E/P, C, h)
        out = torch.stack([expert(received[:, i]) for i, expert in enumerate(layer.experts)], dim=1)
        back = all_to_all(out.reshape(layer.n_experts, capacity, -1), self.group)  # (E, C, h), as sent
        element = x.element_size() * x.shape[1]
        offrank = (experts // local != self.rank) & (positions >= 0)
        self.last_bytes = {name: (world - 1) * local * capacity * element for name in ("dispatch", "combine")}
        self.last_token_bytes = int(offrank.sum()) * element
        layer.last_logits, layer.last_experts, layer.last_positions = logits.detach(), experts, positions
        return combine(back, experts, positions, weights) + layer.shared_out(x)
