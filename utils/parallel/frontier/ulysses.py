"""DeepSpeed-Ulysses: context parallelism by two all-to-alls between sequence and head sharding.

Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for Enabling
Training of Extreme Long Sequence Transformer Models" (arXiv:2309.14509),
section 3: each of ``P`` ranks holds ``S / P`` tokens of every head. Before
attention an all-to-all (:func:`sequence_to_heads`) gives each rank the whole
sequence of ``H / P`` heads; attention runs locally, head by head, on the full
sequence (any kernel: here SDPA); a second all-to-all
(:func:`heads_to_sequence`) brings the output back to sequence sharding.
Heads never interact inside attention, so this is exact, and every rank does
the same work whatever the mask (no causal imbalance). The limit: whole heads
per rank, so ``P`` must divide the query heads, and under grouped-query
attention the KV heads too (:func:`check_ulysses_degree`).

Communication (:func:`ulysses_bytes_per_gpu`): an all-to-all of ``M`` bytes in
all over ``P`` ranks makes each rank send ``(P - 1) / P`` of its ``M / P``.
Per layer forward the q, k, v and output all-to-alls move ``M = b S (2 h + 2 h_kv) d e``;
the paper counts ``4 N h / P`` per link for ``h_kv = h`` (hidden ``h d``), dropping ``(P - 1) / P``.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from utils.attention.flash_reference import check_qkv
from utils.validate import check_element_size, check_positive_int


def check_ulysses_degree(heads: int, kv_heads: int, world_size: int) -> int:
    """``world_size`` if it divides both the query heads and the KV heads; else ``ValueError`` saying which."""
    h, hkv, p = (check_positive_int(n, v) for n, v in (("heads", heads), ("kv_heads", kv_heads),
                                                        ("world_size", world_size)))
    if h % hkv:
        raise ValueError(f"heads ({h}) must be a multiple of kv_heads ({hkv}) (grouped-query attention)")
    if h % p or hkv % p:
        raise ValueError(f"Ulysses gives each of the {p} ranks whole heads: the degree must divide the "
                         f"{h} query heads and the {hkv} KV heads, so it can be at most {math.gcd(h, hkv)} "
                         f"(a divisor of {hkv})")
    return p


def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)  # after .contiguous(), so the output is contiguous too
    dist.all_to_all_single(out, x, group=group)  # splits and gathers dim 0 in P equal parts
    return out


def _seq_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    p = dist.get_world_size(group)
    b, h, n, d = x.shape
    parts = x.reshape(b, p, h // p, n, d).transpose(0, 1)  # part j: the heads rank j will own
    got = _all_to_all(parts, group)  # got[j]: rank j's tokens of my heads
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // p, p * n, d)


def _heads_to_seq(x: torch.Tensor, group) -> torch.Tensor:
    p = dist.get_world_size(group)
    b, hp, s, d = x.shape
    parts = x.reshape(b, hp, p, s // p, d).permute(2, 0, 1, 3, 4)  # part j: rank j's tokens
    got = _all_to_all(parts, group)  # got[j]: rank j's heads of my tokens
    return got.transpose(0, 1).reshape(b, p * hp, s // p, d)


class _SequenceToHeads(torch.autograd.Function):
    """All-to-all forward (sequence -> head sharding); its inverse all-to-all backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _seq_to_heads(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _heads_to_seq(grad, ctx.group), None


class _HeadsToSequence(torch.autograd.Function):
    """All-to-all forward (head -> sequence sharding); its inverse all-to-all backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _heads_to_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _seq_to_heads(grad, ctx.group), None


def _check_group_and_tensor(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"{name} must be a 4-D tensor (batch, heads, seq, head_dim), got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if not dist.is_initialized():
        raise ValueError("Ulysses needs an initialised process group (use utils.dist.launch or torchrun)")


def sequence_to_heads(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``(b, H, S/P, d)`` sequence-sharded (contiguous, rank order) -> ``(b, H/P, S, d)`` head-sharded (differentiable).

    Rank ``r`` gets heads ``[r H/P, (r + 1) H/P)`` of the whole sequence.
    ``ValueError`` if ``P`` does not divide the heads.
    """
    _check_group_and_tensor(x, "x")
    p = dist.get_world_size(group)
    if x.shape[1] % p:
        raise ValueError(f"Ulysses gives each of the {p} ranks whole heads: {x.shape[1]} heads are not divisible by {p}")
    return _SequenceToHeads.apply(x, group)


def heads_to_sequence(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``(b, H/P, S, d)`` head-sharded -> ``(b, H, S/P, d)`` sequence-sharded; inverts :func:`sequence_to_heads`."""
    _check_group_and_tensor(x, "x")
    p = dist.get_world_size(group)
    if x.shape[2] % p:
        raise ValueError(f"the sequence ({x.shape[2]} tokens) must split into {p} equal slices, one per rank")
    return _HeadsToSequence.apply(x, group)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      group: dist.ProcessGroup | None = None, sm_scale: float | None = None) -> torch.Tensor:
    """This rank's rows of full attention, computed Ulysses-style (differentiable).

    Call on every rank of ``group`` with this rank's contiguous slice
    ``(batch, heads, S/P, head_dim)`` of q, k, v (rank ``r`` holds tokens
    ``[r S/P, (r + 1) S/P)``: ``shard_sequence(x, r, P, "contiguous")``; k and v
    may have fewer heads, a divisor of q's). The result has q's shape.
    ``ValueError`` where ``P`` does not divide the query or the KV heads.
    """
    check_qkv(q, k, v, causal, gqa=True)
    _check_group_and_tensor(q, "q")
    check_ulysses_degree(q.shape[1], k.shape[1], dist.get_world_size(group))
    qh, kh, vh = (sequence_to_heads(t, group) for t in (q, k, v))
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=bool(causal), scale=sm_scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return heads_to_sequence(out, group)


def ulysses_bytes_per_gpu(seq_len: int, heads: int, kv_heads: int, head_dim: int, world_size: int,
                          batch: int = 1, element_size: int = 2) -> float:
    """Bytes one rank sends in one layer's forward attention: the q, k, v and output all-to-alls.

    Each all-to-all leaves ``1/P`` of a rank's ``b (S/P) h' d`` elements at
    home and sends the rest: ``(P - 1)/P^2 * b S (2 h + 2 h_kv) d e`` in all.
    Backward sends the same again (the inverse all-to-alls of the gradients).
    Jacobs et al. 2023, section 3.2, count ``4 N h / P`` per link for
    ``h_kv = h`` and hidden ``h d``, i.e. this without the ``(P - 1)/P``.
    """
    s, d, p = (check_positive_int(n, v) for n, v in (("seq_len", seq_len), ("head_dim", head_dim),
                                                      ("world_size", world_size)))
    b, e = check_positive_int("batch", batch), check_element_size(element_size)
    check_ulysses_degree(heads, kv_heads, p)
    if s % p:
        raise ValueError(f"seq_len ({s}) must split into {p} equal slices, one per rank")
    return (p - 1) / p**2 * b * s * (2 * heads + 2 * kv_heads) * d * e
