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
model of :mod:`utils.parallel.comm.network`.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from utils.parallel.frontier.moe import MoELayer, combine, dispatch, expert_capacity
from utils.validate import check_element_size, check_nonnegative, check_positive, check_positive_int


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
