"""ZeRO stage 2: gradients and optimizer state sharded, each gradient reduce-scattered as backward produces it.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models" (arXiv:1910.02054), section 5.2: with P_os+g each process updates only its
partition of the parameters, so it needs only the reduced gradients of that
partition; each gradient is reduced to the rank that owns it as soon as backward
produces it (a reduce-scatter, bucketed), and its memory is then released. Model
states per GPU: ``2 Psi + (2 + K) Psi / N_d`` (their Figure 1; here with fp32
weights: ``4 Psi + (4 + K) Psi / N_d``), against stage 1's ``4 Psi + 4 Psi + K Psi / N_d``.

:class:`ZeroTwoOptimizer` shards every parameter separately: flattened and padded to
``N`` equal slices, slice ``r`` belongs to rank ``r``. A hook on each parameter
(``register_post_accumulate_grad_hook``) fires when backward has finished that
parameter's gradient; it reduce-scatters the gradient, keeps this rank's averaged
slice and frees the full gradient. So besides the ``Psi / N`` of gradient slices, at
most one parameter's full gradient is alive at a time (:attr:`full_grad_peak_nbytes`
measures it). ``step()`` runs the wrapped optimizer on the slices, then all-gathers
every parameter. Per step it makes one reduce-scatter and one all-gather per
parameter: the bytes of one all-reduce, in more calls than stage 1's two (a real
implementation buckets them, as DDP does).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from utils.parallel.comm.collectives import all_gather_single, reduce_scatter_single
from utils.parallel.data.data_parallel import trainable_parameters


class ZeroTwoOptimizer:
    """ZeRO stage 2 over ``params`` with ``optimizer_cls`` (Adam by default) on this rank's slices.

    Call ``backward()`` as usual: the hooks shard the gradients. Then ``step()`` and ``zero_grad()``.
    All parameters must share one dtype and device; every rank must build it over the same parameters
    in the same order (the hooks' collectives run in backward's order, the same on every rank).
    ``group`` (default: the whole world) is the data-parallel group the state is sharded over.
    """

    def __init__(self, params: Iterable[torch.Tensor], optimizer_cls: type = torch.optim.Adam,
                 group: dist.ProcessGroup | None = None, **optimizer_kwargs: Any) -> None:
        self.params = trainable_parameters(params, "ZeroTwoOptimizer")
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.slice_numel = [-(-p.numel() // self.world_size) for p in self.params]
        with torch.no_grad():
            self.shards = [nn.Parameter(self._padded(p, n)[self.rank * n:(self.rank + 1) * n].clone())
                           for p, n in zip(self.params, self.slice_numel)]
        self.optimizer = optimizer_cls(self.shards, **optimizer_kwargs)
        self.full_grad_peak_nbytes = 0
        """The most bytes of full (unsharded) gradient seen alive at once: one parameter's, at most."""
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._hooks = [p.register_post_accumulate_grad_hook(self._shard_gradient) for p in self.params]

    def _padded(self, t: torch.Tensor, slice_numel: int) -> torch.Tensor:
        """``t`` flattened and zero-padded to ``world_size * slice_numel`` elements."""
        return F.pad(t.reshape(-1), (0, slice_numel * self.world_size - t.numel()))

    @torch.no_grad()
    def _shard_gradient(self, p: torch.Tensor) -> None:
        """Reduce-scatter ``p.grad``, keep the mean of this rank's slice, free the full gradient."""
        i = self._index[id(p)]
        self.full_grad_peak_nbytes = max(self.full_grad_peak_nbytes, p.grad.numel() * p.grad.element_size())
        piece = torch.empty_like(self.shards[i])
        reduce_scatter_single(piece, self._padded(p.grad, self.slice_numel[i]), op=dist.ReduceOp.SUM, group=self.group)
        piece.div_(self.world_size)
        shard = self.shards[i]
        shard.grad = piece if shard.grad is None else shard.grad.add_(piece)  # gradient accumulation
        p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """Update this rank's slices, then all-gather every parameter from its ``N`` slices."""
        self.optimizer.step()
        for p, shard, n in zip(self.params, self.shards, self.slice_numel):
            full = torch.empty(n * self.world_size, dtype=p.dtype, device=p.device)
            all_gather_single(full, shard.detach(), group=self.group)
            p.copy_(full[:p.numel()].view_as(p))

    def shard_of(self, p: torch.Tensor) -> nn.Parameter:
        """The slice of ``p`` this rank updates (its ``.grad`` is the reduced gradient of that slice)."""
        return self.shards[self._index[id(p)]]

    def zero_grad(self) -> None:
        for t in self.params + self.shards:
            t.grad = None

    def gradient_nbytes(self) -> int:
        """Bytes of gradient this rank holds now: its slices, plus any full gradient not yet sharded."""
        return sum(t.grad.numel() * t.grad.element_size() for t in self.params + self.shards if t.grad is not None)

    def remove_hooks(self) -> None:
        """Detach the gradient hooks (the parameters then behave as without this optimizer)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
