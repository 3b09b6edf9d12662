"""Sequence parallelism's communication: all-gather and reduce-scatter along the sequence, as autograd functions.

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (arXiv:2205.05198), section 4.2.2 and Figure 5: between the
tensor-parallel regions of a transformer layer, the LayerNorm and dropout run on
``1/t`` of the sequence on each of the ``t`` ranks, so their activations are
sharded too. Tensor parallelism's ``f`` and ``g`` (:mod:`utils.parallel.model.tensor_parallel`)
are then replaced by a conjugate pair (Korthikanti et al. call them ``g`` and
``g-bar``; Megatron-LM's all-reduce-in-forward is also called ``g``, so the book
writes them out):

* :class:`GatherFromSequenceParallelRegion`: all-gather along the sequence in
  forward, reduce-scatter in backward; it enters a tensor-parallel region;
* :class:`ReduceScatterToSequenceParallelRegion`: reduce-scatter along the
  sequence in forward, all-gather in backward; it leaves one (after the
  row-parallel linear).

Used as is before a linear layer, the all-gather hands autograd the *gathered*
input, ``sbh`` elements, and the linear saves it for its weight gradient: the
``4sbh`` bytes of the first linears' inputs (of eq. 4's ``34/t``) are then not
divided by ``t``. Section 4.2.2 keeps only the shard, ``sbh/t``, and all-gathers
it again in backward; Megatron-LM does this in
``LinearWithGradAccumulationAndAsyncCommunication``
(``megatron/core/tensor_parallel/layers.py``), starting the all-gather
asynchronously so it overlaps the input-gradient GEMM. :class:`AllGatherLinears`
is that function: forward, one all-gather; backward, one all-gather and one
reduce-scatter. So sequence parallelism is not free in communication: per
layer it moves the bytes of Megatron's 4 all-reduces (8 ring phases: a
reduce-scatter plus an all-gather each) plus 2 all-gathers, 10 phases of
``bsh`` elements instead of 8, 25 % more, which Megatron overlaps with compute.

The collectives are torch's flat ``all_gather_single`` and
``reduce_scatter_single``, under whichever name this torch has
(:mod:`utils.parallel.comm.collectives`); they concatenate along dimension 0, so
other sequence dimensions are moved to the front and back.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import torch.nn.functional as F

from utils.parallel.comm.collectives import all_gather_single, reduce_scatter_single


def _check_dim(tensor: torch.Tensor, dim: int) -> int:
    if not -tensor.dim() <= dim < tensor.dim():
        raise ValueError(f"seq_dim={dim} is out of range for a tensor of {tensor.dim()} dimensions")
    return dim % tensor.dim()


def _start_all_gather(local: torch.Tensor, dim: int, group: dist.ProcessGroup | None):
    """Start the all-gather of ``local`` along ``dim``; (buffer with the sequence in front, work handle)."""
    t = dist.get_world_size(group)
    front = local.movedim(dim, 0).contiguous()
    full = torch.empty((t * front.shape[0], *front.shape[1:]), dtype=local.dtype, device=local.device)
    return full, all_gather_single(full, front, group=group, async_op=True)


def _start_reduce_scatter(full: torch.Tensor, dim: int, group: dist.ProcessGroup | None):
    """Start the reduce-scatter of ``full`` along ``dim``; (this rank's slice, sequence in front; work handle)."""
    t = dist.get_world_size(group)
    if full.shape[dim] % t:
        raise ValueError(f"sequence parallelism needs a sequence length divisible by the tensor-parallel size: "
                         f"{full.shape[dim]} tokens over {t} ranks")
    front = full.movedim(dim, 0).contiguous()
    local = torch.empty((front.shape[0] // t, *front.shape[1:]), dtype=full.dtype, device=full.device)
    return local, reduce_scatter_single(local, front, group=group, async_op=True)


def all_gather_sequence(local: torch.Tensor, seq_dim: int = 0, group: dist.ProcessGroup | None = None
                        ) -> torch.Tensor:
    """Concatenate every rank's ``local`` along ``seq_dim``, in rank order (no autograd)."""
    dim = _check_dim(local, seq_dim)
    full, work = _start_all_gather(local, dim, group)
    work.wait()
    return full.movedim(0, dim)


def reduce_scatter_sequence(full: torch.Tensor, seq_dim: int = 0, group: dist.ProcessGroup | None = None
                            ) -> torch.Tensor:
    """Sum ``full`` over the ranks and keep this rank's ``1/t`` slice of ``seq_dim`` (no autograd).

    Raises ``ValueError`` when the sequence length does not divide by the group size.
    """
    dim = _check_dim(full, seq_dim)
    local, work = _start_reduce_scatter(full, dim, group)
    work.wait()
    return local.movedim(0, dim)


def split_sequence(full: torch.Tensor, seq_dim: int = 0, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's ``1/t`` slice of ``full`` along ``seq_dim`` (a copy; no communication, no autograd)."""
    dim = _check_dim(full, seq_dim)
    t, rank = dist.get_world_size(group), dist.get_rank(group)
    if full.shape[dim] % t:
        raise ValueError(f"sequence parallelism needs a sequence length divisible by the tensor-parallel size: "
                         f"{full.shape[dim]} tokens over {t} ranks")
    return full.chunk(t, dim=dim)[rank].clone(memory_format=torch.contiguous_format)  # a view would keep all of full


class GatherFromSequenceParallelRegion(torch.autograd.Function):
    """Korthikanti et al.'s ``g`` (Figure 5): all-gather along the sequence forward, reduce-scatter backward.

    Followed by a linear layer, that layer saves the gathered input; :class:`AllGatherLinears` saves the shard.
    """

    @staticmethod
    def forward(ctx, local: torch.Tensor, seq_dim: int, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.seq_dim, ctx.group = seq_dim, group
        return all_gather_sequence(local, seq_dim, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return reduce_scatter_sequence(grad, ctx.seq_dim, ctx.group), None, None


class ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Korthikanti et al.'s ``g-bar`` (Figure 5): reduce-scatter along the sequence forward, all-gather backward."""

    @staticmethod
    def forward(ctx, full: torch.Tensor, seq_dim: int, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.seq_dim, ctx.group = seq_dim, group
        return reduce_scatter_sequence(full, seq_dim, group)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return all_gather_sequence(grad, ctx.seq_dim, ctx.group), None, None


class AllGatherLinears(torch.autograd.Function):
    """Korthikanti et al. section 4.2.2: all-gather the sequence, then linear layers; save only the shard.

    Forward: one all-gather of ``local`` along ``seq_dim``, then
    ``F.linear(full, W_i, b_i)`` for each pair; ``ctx`` keeps ``local`` (``1/t``
    of the sequence) and the weights, not the gathered input. Backward, in
    Megatron-LM's order (``LinearWithGradAccumulationAndAsyncCommunication``):
    start the all-gather of ``local`` again, compute the input gradient
    ``sum_i dY_i W_i`` meanwhile (it needs no input), wait, start the
    reduce-scatter of that gradient, compute the weight gradients
    ``dY_i^T X`` meanwhile, wait. Several linears that share one input
    (attention's q, k, v) share the two collectives.
    """

    @staticmethod
    def forward(ctx, local: torch.Tensor, seq_dim: int, group: dist.ProcessGroup | None, *params):
        dim = _check_dim(local, seq_dim)
        weights, biases = params[0::2], params[1::2]
        ctx.dim, ctx.group, ctx.has_bias = dim, group, [b is not None for b in biases]
        ctx.save_for_backward(local, *weights)
        full = all_gather_sequence(local, dim, group)
        return tuple(F.linear(full, w, b) for w, b in zip(weights, biases))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        local, *weights = ctx.saved_tensors
        dim, group = ctx.dim, ctx.group
        full_front, gathering = _start_all_gather(local, dim, group)  # the extra all-gather of section 4.2.2
        grad_full = sum(g @ w for g, w in zip(grads, weights))  # overlaps the all-gather
        gathering.wait()
        grad_local, scattering = _start_reduce_scatter(grad_full, dim, group)
        full = full_front.movedim(0, dim).flatten(0, -2)
        params = []
        for g, has_bias in zip(grads, ctx.has_bias):  # overlap the reduce-scatter
            g2 = g.flatten(0, -2)
            params += [g2.t() @ full, g2.sum(0) if has_bias else None]
        scattering.wait()
        return (grad_local.movedim(0, dim), None, None, *params)


def all_gather_linears(local: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor | None]],
                       seq_dim: int = 0, group: dist.ProcessGroup | None = None) -> tuple[torch.Tensor, ...]:
    """``F.linear(all_gather(local), W, b)`` for each ``(W, b)`` in ``layers``, saving only ``local`` for backward.

    Korthikanti et al. section 4.2.2 (:class:`AllGatherLinears`): one all-gather
    in forward; one all-gather and one reduce-scatter in backward, whatever the
    number of layers. ``ValueError`` on an empty ``layers``.
    """
    if not layers:
        raise ValueError("all_gather_linears needs at least one (weight, bias) pair")
    return AllGatherLinears.apply(local, seq_dim, group, *(p for pair in layers for p in pair))


def gather_from_sequence_parallel(local: torch.Tensor, seq_dim: int = 0,
                                  group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Korthikanti's ``g``: the full sequence from every rank's slice; its gradient is reduce-scattered back."""
    return GatherFromSequenceParallelRegion.apply(local, seq_dim, group)


def reduce_scatter_to_sequence_parallel(full: torch.Tensor, seq_dim: int = 0,
                                        group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Korthikanti's ``g-bar``: this rank's slice of the sum of the ranks' partial outputs; its gradient is all-gathered."""
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
