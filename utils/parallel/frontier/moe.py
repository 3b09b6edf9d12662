"""A mixture-of-experts layer on one process: routers, the load-balancing loss, capacity and dropped tokens.

A mixture-of-experts (MoE) layer replaces a transformer's MLP by ``E`` expert
MLPs and a router that sends each token to ``k`` of them (Shazeer et al. 2017;
GShard, arXiv:2006.16668; Switch, arXiv:2101.03961; Mixtral, arXiv:2401.04088).
Two routers (:data:`ROUTERS`):

- ``"softmax"``: ``p = softmax(x W_r)``, the ``k`` largest ``p_i`` chosen;
  their weights are ``p_i`` (Switch, ``k = 1``) or ``p_i`` renormalised over
  the ``k`` chosen (GShard's top-2, Mixtral's ``softmax(TopK(x W_r))``);
- ``"sigmoid_bias"``: DeepSeek-V3's affinities ``s_i = sigmoid(x W_r)`` (its
  report, arXiv:2412.19437, §2.1.2, eqs. 15-16): the ``k`` largest
  ``s_i + b_i`` are chosen, the weights are ``s_i`` renormalised over them, and
  the per-expert bias ``b`` acts on the choice only. After each step ``b_i``
  falls by ``gamma`` when expert ``i`` got more than the mean load and rises
  by ``gamma`` when it got less (:func:`update_expert_bias`): the
  auxiliary-loss-free balancing of Wang et al. (arXiv:2408.15664) that
  DeepSeek-V3 adopts.

Capacity: with ``T`` tokens, each expert takes at most
``C = ceil(capacity_factor * T * k / E)`` of them (:func:`expert_capacity`).
Assignments are served in GShard's order (its Algorithm 1): every token's
first choice before any second choice, tokens in order within a choice; those
past ``C`` are dropped and contribute nothing (the residual stream carries the
token on). ``capacity_factor=None`` drops nothing.

Tokens are routed in groups (GShard's "local group dispatching"): each of
``groups`` equal slices of the tokens has its own capacity, as each rank of an
expert-parallel layer does (:mod:`utils.parallel.frontier.expert_parallel`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from utils.validate import check_positive, check_positive_int

ROUTERS = ("softmax", "sigmoid_bias")
"""The routers of :func:`route`: top-k softmax (Switch, GShard, Mixtral) and DeepSeek-V3's sigmoid with a bias."""


def _check_logits(router_logits: torch.Tensor) -> torch.Tensor:
    if not isinstance(router_logits, torch.Tensor) or router_logits.dim() != 2 or router_logits.shape[1] < 1:
        shape = tuple(router_logits.shape) if isinstance(router_logits, torch.Tensor) else type(router_logits).__name__
        raise ValueError(f"router_logits must be a tensor of shape (tokens, n_experts), got {shape}")
    if not router_logits.is_floating_point():
        raise ValueError(f"router_logits must be floating point, got {router_logits.dtype}")
    return router_logits


def _check_top_k(top_k: int, n_experts: int) -> int:
    check_positive_int("top_k", top_k)
    if top_k > n_experts:
        raise ValueError(f"top_k must be at most n_experts={n_experts} (a token picks distinct experts), got {top_k}")
    return top_k


def route(router_logits: torch.Tensor, top_k: int, router: str = "softmax", expert_bias: torch.Tensor | None = None,
          renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights, experts)``, both ``(tokens, top_k)``: each token's chosen experts and their gate weights.

    ``"softmax"``: the top-k of ``softmax(logits)``; ``renormalize`` divides the
    weights by their sum (Mixtral, GShard top-2), else they stay the
    probabilities (Switch). ``"sigmoid_bias"``: the top-k of
    ``sigmoid(logits) + expert_bias`` (zeros if None), weighted by the sigmoid
    affinities renormalised over the chosen experts (DeepSeek-V3 §2.1.2; its
    inference code multiplies by a further constant ``route_scale``, left out).
    """
    logits = _check_logits(router_logits)
    n_experts = logits.shape[1]
    _check_top_k(top_k, n_experts)
    if router == "softmax":
        scores = logits.softmax(dim=-1)
        weights, experts = scores.topk(top_k, dim=-1)
    elif router == "sigmoid_bias":
        scores = logits.sigmoid()
        bias = scores.new_zeros(n_experts) if expert_bias is None else expert_bias
        if bias.shape != (n_experts,):
            raise ValueError(f"expert_bias must have shape ({n_experts},), got {tuple(bias.shape)}")
        experts = (scores.detach() + bias.to(scores)).topk(top_k, dim=-1).indices  # the bias picks, never weighs
        weights = scores.gather(1, experts)
        renormalize = True
    else:
        raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def expert_load(experts: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Assignments each expert received: ``(n_experts,)`` counts of ``experts`` (any shape of expert ids)."""
    check_positive_int("n_experts", n_experts)
    return torch.bincount(experts.reshape(-1), minlength=n_experts)


def update_expert_bias(expert_bias: torch.Tensor, experts: torch.Tensor, speed: float) -> torch.Tensor:
    """DeepSeek-V3's bias update after a step: ``b_i + speed * sign(mean load - load_i)``.

    "At the end of each step, we will decrease the bias term by gamma if its
    corresponding expert is overloaded, and increase it by gamma if its
    corresponding expert is underloaded" (arXiv:2412.19437, §2.1.2; ``gamma = 0.001`` for the first
    14.3T tokens, §4.2). Overloaded means above the mean load ``T k / E``, as
    in Wang et al.'s Algorithm 1 (arXiv:2408.15664). Returns a new tensor.
    """
    check_positive("speed", speed)
    load = expert_load(experts, expert_bias.shape[0]).to(expert_bias.dtype)
    return expert_bias + speed * torch.sign(load.mean() - load)


def load_balancing_loss(router_logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """The auxiliary loss ``N * sum_i f_i P_i`` of Switch (arXiv:2101.03961, eq. 4) with top-k as in Mixtral.

    ``f_i``: the fraction of tokens that choose expert ``i`` among their top-k
    softmax probabilities (so ``sum_i f_i = k``); ``P_i``: the mean over tokens
    of the softmax probability of ``i``. Hugging Face's Mixtral
    ``load_balancing_loss_func`` computes the same (its ``tokens_per_expert`` is
    ``f`` split by choice rank, summed over the ranks by the product). A
    perfectly balanced router scores ``k``; Switch (``k = 1``) scores 1. Only
    ``P`` carries gradient. Multiply by a small coefficient (Switch: 1e-2).
    DeepSeek-V2/V3's balance losses scale differently (``f_i`` times ``N / k``,
    no factor ``N``: balanced at 1), so coefficients do not carry over.
    """
    logits = _check_logits(router_logits)
    n_experts = logits.shape[1]
    _check_top_k(top_k, n_experts)
    probs = logits.float().softmax(dim=-1)
    chosen = probs.topk(top_k, dim=-1).indices
    f = expert_load(chosen, n_experts).float() / logits.shape[0]
    return n_experts * (f * probs.mean(dim=0)).sum()


def expert_capacity(tokens: int, n_experts: int, top_k: int, capacity_factor: float | None) -> int:
    """Tokens one expert accepts: ``ceil(capacity_factor * tokens * top_k / n_experts)``; ``tokens`` when None.

    Switch (§2.2): "(tokens per batch / number of experts) x capacity factor",
    with ``k`` assignments per token here. None means no dropping: an expert
    is chosen at most once per token, so ``tokens`` slots always suffice.
    """
    check_positive_int("tokens", tokens)
    check_positive_int("n_experts", n_experts)
    _check_top_k(top_k, n_experts)
    if capacity_factor is None:
        return tokens
    check_positive("capacity_factor", capacity_factor, finite=True)
    return max(1, min(tokens, math.ceil(capacity_factor * tokens * top_k / n_experts)))


def positions_in_experts(experts: torch.Tensor, n_experts: int, capacity: int) -> torch.Tensor:
    """``(tokens, k)``: each assignment's slot in its expert's buffer, or -1 where it is dropped.

    GShard's order: choice rank first, then token order; an assignment whose
    place in that queue is ``capacity`` or later is dropped.
    """
    check_positive_int("capacity", capacity)
    if experts.dim() != 2:
        raise ValueError(f"experts must have shape (tokens, top_k), got {tuple(experts.shape)}")
    one_hot = F.one_hot(experts.t().reshape(-1), n_experts)  # (k * tokens, E): choice rank major
    place = ((one_hot.cumsum(dim=0) - 1) * one_hot).sum(dim=1).reshape(experts.shape[1], -1).t()
    return torch.where(place < capacity, place, torch.full_like(place, -1))


def dispatch(x: torch.Tensor, experts: torch.Tensor, positions: torch.Tensor, n_experts: int,
             capacity: int) -> torch.Tensor:
    """``(n_experts, capacity, hidden)``: row ``c`` of expert ``e`` holds the token placed there (zeros if none)."""
    kept = positions >= 0
    token = torch.arange(x.shape[0], device=experts.device).unsqueeze(1).expand_as(experts)[kept]
    buffer = x.new_zeros(n_experts * capacity, x.shape[1])
    return buffer.index_copy(0, experts[kept] * capacity + positions[kept], x[token]).view(n_experts, capacity, -1)


def combine(expert_out: torch.Tensor, experts: torch.Tensor, positions: torch.Tensor,
            weights: torch.Tensor) -> torch.Tensor:
    """``(tokens, hidden)``: ``sum_j weights[t, j] * expert_out[experts[t, j], positions[t, j]]`` over kept assignments."""
    n_experts, capacity, hidden = expert_out.shape
    kept = (positions >= 0)
    rows = (experts * capacity + positions.clamp(min=0)).reshape(-1)
    gathered = expert_out.reshape(n_experts * capacity, hidden)[rows].view(*experts.shape, hidden)
    return (gathered * (weights * kept).unsqueeze(-1)).sum(dim=1)


class Expert(nn.Module):
    """One expert: a bias-free SwiGLU MLP ``W_2 (silu(W_1 x) * W_3 x)`` of ``3 h f`` parameters (Mixtral, DeepSeek)."""

    def __init__(self, hidden: int, ffn_hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn_hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn_hidden, bias=False)
        self.w2 = nn.Linear(ffn_hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoELayer(nn.Module):
    """Routed experts (and ``n_shared`` shared experts every token passes through, as in DeepSeekMoE) on one process.

    ``forward(x, groups=1)`` takes ``(tokens, hidden)`` and returns
    ``shared(x) + sum_j g_j E_{e_j}(x)``. After a call, ``last_logits``,
    ``last_experts`` and ``last_positions`` (-1: dropped) hold the routing,
    and ``expert_bias`` (a buffer) the sigmoid router's bias.
    """

    def __init__(self, hidden: int, ffn_hidden: int, n_experts: int, top_k: int,
                 capacity_factor: float | None = None, n_shared: int = 0, router: str = "softmax",
                 renormalize: bool = True) -> None:
        super().__init__()
        for name, value in (("hidden", hidden), ("ffn_hidden", ffn_hidden), ("n_experts", n_experts)):
            check_positive_int(name, value)
        _check_top_k(top_k, n_experts)
        if n_shared < 0 or int(n_shared) != n_shared:
            raise ValueError(f"n_shared must be an int >= 0, got {n_shared!r}")
        if router not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
        if capacity_factor is not None:
            check_positive("capacity_factor", capacity_factor, finite=True)
        self.hidden, self.n_experts, self.top_k = hidden, n_experts, top_k
        self.capacity_factor, self.router_kind, self.renormalize = capacity_factor, router, renormalize
        self.router = nn.Linear(hidden, n_experts, bias=False)
        self.register_buffer("expert_bias", torch.zeros(n_experts))
        self.experts = nn.ModuleList(Expert(hidden, ffn_hidden) for _ in range(n_experts))
        self.shared = nn.ModuleList(Expert(hidden, ffn_hidden) for _ in range(n_shared))

    def check_input(self, x: torch.Tensor, groups: int = 1) -> int:
        """Tokens per group of ``x``, or ValueError if ``x`` is not ``(tokens, hidden)`` split into ``groups``."""
        check_positive_int("groups", groups)
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.hidden:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (tokens, {self.hidden}), got {shape}")
        if x.shape[0] == 0 or x.shape[0] % groups:
            raise ValueError(f"tokens ({x.shape[0]}) must be a positive multiple of groups ({groups})")
        return x.shape[0] // groups

    def assign(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
        """Route one group of tokens: ``(weights, experts, positions, capacity, logits)``."""
        logits = self.router(x)
        weights, experts = route(logits, self.top_k, self.router_kind, self.expert_bias, self.renormalize)
        capacity = expert_capacity(x.shape[0], self.n_experts, self.top_k, self.capacity_factor)
        return weights, experts, positions_in_experts(experts, self.n_experts, capacity), capacity, logits

    def shared_out(self, x: torch.Tensor) -> torch.Tensor:
        """The shared experts' sum (zeros without them)."""
        return sum((expert(x) for expert in self.shared), torch.zeros_like(x))

    def forward(self, x: torch.Tensor, groups: int = 1) -> torch.Tensor:
        per_group = self.check_input(x, groups)
        chunks = x.split(per_group)
        routed = [self.assign(chunk) for chunk in chunks]
        # (groups, E, C, h): each expert runs once on its slots of every group, in group order.
        buffers = torch.stack([dispatch(c, r[1], r[2], self.n_experts, r[3]) for c, r in zip(chunks, routed)])
        out = torch.stack([expert(buffers[:, i]) for i, expert in enumerate(self.experts)], dim=1)
        y = torch.cat([combine(out[g], r[1], r[2], r[0]) for g, r in enumerate(routed)])
        self.last_logits = torch.cat([r[4] for r in routed]).detach()
        self.last_experts = torch.cat([r[1] for r in routed])
        self.last_positions = torch.cat([r[2] for r in routed])
        return y + self.shared_out(x)
