"""Sequence parallelism's communication: all-gather and reduce-scatter along the sequence, as autograd functions.

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (arXiv:2205.05198), section 4.2.2 and Figure 5: between the
tensor-parallel regions of a transformer layer, the LayerNorm and dropout run on
``1/t`` of the sequence on each of the ``t`` ranks, so their activations are
sharded too. Tensor parallelism's ``f`` and ``g`` (:mod:`utils.parallel.tensor_parallel`)
are then replaced by a conjugate pair:

* ``g`` (:class:`GatherFromSequenceParallelRegion`): all-gather along the
  sequence in forward, reduce-scatter in backward; it enters a tensor-parallel
  region (before the column-parallel linear);
* ``g-bar`` (:class:`ReduceScatterToSequenceParallelRegion`): reduce-scatter
  along the sequence in forward, all-gather in backward; it leaves one (after
  the row-parallel linear).

A reduce-scatter plus an all-gather move the bytes of one all-reduce (a ring
all-reduce *is* those two phases), so sequence parallelism costs no extra
communication. The collectives are torch's flat ``all_gather_single`` and
``reduce_scatter_single``, under whichever name this torch has
(:mod:`utils.parallel.collectives`); they concatenate along dimension 0, so
other sequence dimensions are moved to the front and back.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from utils.parallel.collectives import all_gather_single, reduce_scatter_single


def _check_dim(tensor: torch.Tensor, dim: int) -> int:
    if not -tensor.dim() <= dim < tensor.dim():
        raise ValueError(f"seq_dim={dim} is out of range for a tensor of {tensor.dim()} dimensions")
    return dim % tensor.dim()


def all_gather_sequence(local: torch.Tensor, seq_dim: int = 0, group: dist.ProcessGroup | None = None
                        ) -> torch.Tensor:
    """Concatenate every rank's ``local`` along ``seq_dim``, in rank order (no autograd)."""
    dim = _check_dim(local, seq_dim)
    t = dist.get_world_size(group)
    front = local.movedim(dim, 0).contiguous()
    full = torch.empty((t * front.shape[0], *front.shape[1:]), dtype=local.dtype, device=local.device)
    all_gather_single(full, front, group=group)
    return full.movedim(0, dim)


def reduce_scatter_sequence(full: torch.Tensor, seq_dim: int = 0, group: dist.ProcessGroup | None = None
                            ) -> torch.Tensor:
    """Sum ``full`` over the ranks and keep this rank's ``1/t`` slice of ``seq_dim`` (no autograd).

    Raises ``ValueError`` when the sequence length does not divide by the group size.
    """
    dim = _check_dim(full, seq_dim)
    t = dist.get_world_size(group)
    if full.shape[dim] % t:
        raise ValueError(f"sequence parallelism needs a sequence length divisible by the tensor-parallel size: "
                         f"{full.shape[dim]} tokens over {t} ranks")
    front = full.movedim(dim, 0).contiguous()
    local = torch.empty((front.shape[0] // t, *front.shape[1:]), dtype=full.dtype, device=full.device)
    reduce_scatter_single(local, front, group=group)
    return local.movedim(0, dim)


def split_sequence(full: torch.Tensor, seq_dim: int = 0, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's ``1/t`` slice of ``full`` along ``seq_dim`` (a copy; no communication, no autograd)."""
    dim = _check_dim(full, seq_dim)
    t, rank = dist.get_world_size(group), dist.get_rank(group)
    if full.shape[dim] % t:
        raise ValueError(f"sequence parallelism needs a sequence length divisible by the tensor-parallel size: "
                         f"{full.shape[dim]} tokens over {t} ranks")
    return full.chunk(t, dim=dim)[rank].contiguous()


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """The ``g`` of sequence parallelism (Korthikanti et al. 2022): all-gather along the sequence forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, seq_dim: int, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.seq_dim, ctx.group = seq_dim, group
        return all_gather_sequence(local, seq_dim, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return reduce_scatter_sequence(grad, ctx.seq_dim, ctx.group), None, None


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """The ``g-bar`` of sequence parallelism (Korthikanti et al. 2022): reduce-scatter along the sequence forward, all-gather backward."""

    @staticmethod
    def forward(ctx, full: torch.Tensor, seq_dim: int, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.seq_dim, ctx.group = seq_dim, group
        return reduce_scatter_sequence(full, seq_dim, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return all_gather_sequence(grad, ctx.seq_dim, ctx.group), None, None


def gather_from_sequence_parallel(local: torch.Tensor, seq_dim: int = 0,
                                  group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``g``: the full sequence from every rank's slice; its gradient is reduce-scattered back to the slices."""
    return GatherFromSequenceParallelRegion.apply(local, seq_dim, group)


def reduce_scatter_to_sequence_parallel(full: torch.Tensor, seq_dim: int = 0,
                                        group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """``g-bar``: this rank's slice of the sum of the ranks' partial outputs; its gradient is all-gathered."""
    return ReduceScatterToSequenceParallelRegion.apply(full, seq_dim, group)


def all_reduce_replicated_grads(parameters, group: dist.ProcessGroup | None = None) -> None:
    """Sum the gradients of parameters every rank holds whole (a sequence-parallel LayerNorm's) over ``group``.

    Each rank's LayerNorm saw only its slice of the sequence, so its weight and
    bias gradients are partial sums. Megatron-LM's training loop all-reduces
    them across the tensor-parallel group after backward when sequence
    parallelism is on (``_allreduce_layernorm_grads`` in
    ``megatron/core/distributed/finalize_model_grads.py``).
    """
    for p in parameters:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
