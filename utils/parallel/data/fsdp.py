"""ZeRO stage 3 from backward and forward hooks: parameters, gradients and optimizer state all sharded.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models" (arXiv:1910.02054), section 5.3 (P_os+g+p): each rank stores only its
``1/N`` partition of the parameters; a layer's full parameters are all-gathered
just before its forward and again before its backward, and dropped right after,
so model states per rank fall to ``(2 + 2 + K) Psi / N_d`` (their Figure 1). PyTorch's
FSDP (Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data
Parallel", arXiv:2304.11277, section 3) does the same per *unit*, one
flat buffer per wrapped module, with the gradients reduce-scattered after each
unit's backward; this is that design, small enough to read.

:class:`FullyShardedDataParallel` makes every submodule whose type is in
``shard_modules`` (Linear and Embedding by default) a unit: its direct parameters
are flattened, padded to a multiple of ``N`` and cut into ``N`` fp32 slices; rank
``r`` keeps slice ``r`` as an ``nn.Parameter`` (the optimizer steps it). Per step and unit:

1. forward pre-hook: all-gather the slices (cast to ``compute_dtype`` first, so the
   all-gather moves 16-bit words) into the unit's flat buffer; its parameters become views of it;
2. forward post-hook: free the buffer (its storage is resized to 0 bytes);
3. a hook on the unit's output gradient (it fires just before the unit's backward):
   all-gather again into the *same* storage, which the saved views still point at;
4. when the buffer's gradient is complete (``register_post_accumulate_grad_hook``):
   reduce-scatter it in fp32, keep ``sum / N`` of this rank's slice (the average, as
   DDP), and free the buffer.

So each unit costs 2 all-gathers and 1 reduce-scatter per step (counted in
:attr:`n_all_gathers` and :attr:`n_reduce_scatters`). With ``prefetch=True`` the
next unit's all-gather (forward: registration order; backward: its reverse) is
issued with ``async_op=True`` when the current unit's gather starts, so at most two
units are gathered at once, one without prefetch (:attr:`gathered_peak_nbytes`
counts the live gathered storage). Parameters of other modules (norms, ...) stay
replicated in fp32 and their gradients are all-reduced and averaged in
:meth:`finish_gradient_synchronization`.

Mixed precision follows FSDP2's ``MixedPrecisionPolicy(param_dtype=compute_dtype,
reduce_dtype=float32, output_dtype=float32)``: fp32 master slices, weights cast to
``compute_dtype`` before the all-gather, floating inputs of each unit cast to it,
gradients reduce-scattered and kept in fp32, the wrapper's outputs returned in fp32.
Replicated modules run in fp32 (their inputs are cast up).
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from utils.parallel.comm.collectives import all_gather_single, reduce_scatter_single
from utils.parallel.data.data_parallel import broadcast_parameters

COMPUTE_DTYPES = (None, torch.float32, torch.bfloat16, torch.float16)
"""What ``compute_dtype`` may be: None (compute in fp32), or the dtype weights are all-gathered and used in."""


def _cast(args: Any, dtype: torch.dtype) -> Any:
    """Every floating-point tensor in (nested) ``args`` cast to ``dtype``; other values unchanged."""
    return tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, args)


class _Unit:
    """One sharded module: its parameters' names and shapes, its fp32 slice, its gathered flat buffer."""

    def __init__(self, index: int, name: str, module: nn.Module, rank: int, world_size: int,
                 gather_dtype: torch.dtype) -> None:
        self.index, self.name, self.module = index, name, module
        self.names = [n for n, _ in module.named_parameters(recurse=False)]
        params = [module._parameters[n] for n in self.names]
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        self.numel = sum(self.numels)
        self.slice_numel = -(-self.numel // world_size)
        with torch.no_grad():
            flat = F.pad(torch.cat([p.detach().reshape(-1) for p in params]),
                         (0, self.slice_numel * world_size - self.numel))
            self.shard = nn.Parameter(flat[rank * self.slice_numel:(rank + 1) * self.slice_numel].clone())
        self.full = torch.empty(self.slice_numel * world_size, dtype=gather_dtype, device=flat.device,
                                requires_grad=True)
        self.nbytes = self.full.numel() * self.full.element_size()
        self.full.untyped_storage().resize_(0)
        for n in self.names:  # the module's parameters become plain attributes, views of self.full when gathered
            del module._parameters[n]
        self.gathered = False
        self.pending: tuple[Any, torch.Tensor] | None = None  # (work, its input) of an async all-gather


class FullyShardedDataParallel(nn.Module):
    """ZeRO-3 over ``module``: units of ``shard_modules`` sharded, the rest replicated (see the module docstring).

    Train with ``loss = fsdp(x); loss.backward(); fsdp.finish_gradient_synchronization();
    opt.step(); opt.zero_grad()`` where ``opt`` steps ``fsdp.parameters()``. Every rank
    must build it over the same model (rank 0's weights are broadcast first) and run the
    same units in the same order.
    """

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 shard_modules: tuple[type, ...] = (nn.Linear, nn.Embedding), prefetch: bool = False) -> None:
        super().__init__()
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {COMPUTE_DTYPES}, got {compute_dtype!r}")
        if (not isinstance(shard_modules, tuple) or not shard_modules
                or not all(isinstance(t, type) and issubclass(t, nn.Module) for t in shard_modules)):
            raise ValueError(f"shard_modules must be a non-empty tuple of nn.Module subclasses, got {shard_modules!r}")
        params = list(module.parameters())
        if any(p.dtype != torch.float32 for p in params) or not all(p.requires_grad for p in params):
            raise ValueError("FullyShardedDataParallel needs fp32 parameters that all require a gradient (the fp32 "
                             f"master weights), got {sorted({(str(p.dtype), p.requires_grad) for p in params})}")
        owners: dict[int, str] = {}
        for mod_name, mod in module.named_modules(remove_duplicate=False):
            for p in mod.parameters(recurse=False):
                if owners.setdefault(id(p), mod_name) != mod_name:
                    raise ValueError(f"a parameter is shared by modules {owners[id(p)]!r} and {mod_name!r}; "
                                     "shared (tied) parameters are not supported: untie them or replicate them")
        to_shard = [(name, mod) for name, mod in module.named_modules()
                    if isinstance(mod, shard_modules) and any(True for _ in mod.parameters(recurse=False))]
        if not to_shard:
            raise ValueError(f"no submodule of types {[t.__name__ for t in shard_modules]} has parameters to shard")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.compute_dtype, self.prefetch = compute_dtype, prefetch
        broadcast_parameters(module)
        self.module = module
        self._original_names = [n for n, _ in module.named_parameters()]
        self.units = [_Unit(i, name, mod, self.rank, self.world_size, compute_dtype or torch.float32)
                      for i, (name, mod) in enumerate(to_shard)]
        self.flat_shards = nn.ParameterList([u.shard for u in self.units])
        self.replicated = [p for p in module.parameters()]  # what is left in the module: replicated
        self.n_all_gathers = self.n_reduce_scatters = self.n_all_reduces = 0
        """Collectives issued so far (all-gathers and reduce-scatters of units, all-reduces of replicated grads)."""
        self.gathered_nbytes = self.gathered_peak_nbytes = 0
        """Bytes of gathered (unsharded) parameters alive now, and the most seen alive at once."""
        self._hooks = []
        for unit in self.units:
            self._hooks.append(unit.module.register_forward_pre_hook(self._make_pre_forward(unit)))
            self._hooks.append(unit.module.register_forward_hook(self._make_post_forward(unit)))
            self._hooks.append(unit.full.register_post_accumulate_grad_hook(self._make_post_backward(unit)))
        if compute_dtype not in (None, torch.float32):
            unit_modules = {id(u.module) for u in self.units}
            for mod in module.modules():
                if id(mod) not in unit_modules and any(True for _ in mod.parameters(recurse=False)):
                    self._hooks.append(mod.register_forward_pre_hook(lambda m, args: _cast(args, torch.float32)))

    # --- gathering and freeing -----------------------------------------------------------------------------

    def _issue_gather(self, unit: _Unit, async_op: bool) -> None:
        """All-gather ``unit``'s slices (in the gather dtype) into its flat buffer's storage, re-allocated."""
        if unit.gathered or unit.pending is not None:
            return
        unit.full.untyped_storage().resize_(unit.nbytes)
        self.gathered_nbytes += unit.nbytes
        self.gathered_peak_nbytes = max(self.gathered_peak_nbytes, self.gathered_nbytes)
        piece = unit.shard.detach().to(unit.full.dtype)
        # .data: a tensor on the same storage with its own version counter, so the views autograd saved
        # in forward are not flagged as modified when backward's gather refills them.
        work = all_gather_single(unit.full.data, piece, async_op=async_op)
        self.n_all_gathers += 1
        if async_op:
            unit.pending = (work, piece)
        else:
            unit.gathered = True

    def _gather(self, unit: _Unit, next_unit: _Unit | None) -> None:
        """Make ``unit`` gathered (waiting on its prefetch, if any); with prefetch, start ``next_unit``'s gather."""
        self._issue_gather(unit, async_op=False)
        if unit.pending is not None:
            unit.pending[0].wait()
            unit.pending, unit.gathered = None, True
        if self.prefetch and next_unit is not None:
            self._issue_gather(next_unit, async_op=True)

    def _free(self, unit: _Unit) -> None:
        unit.full.untyped_storage().resize_(0)
        unit.gathered = False
        self.gathered_nbytes -= unit.nbytes

    def _neighbour(self, unit: _Unit, step: int) -> _Unit | None:
        i = unit.index + step
        return self.units[i] if 0 <= i < len(self.units) else None

    # --- the hooks -----------------------------------------------------------------------------------------

    def _make_pre_forward(self, unit: _Unit):
        def hook(module: nn.Module, args: Any) -> Any:
            self._gather(unit, self._neighbour(unit, +1))
            offset = 0
            for name, shape, numel in zip(unit.names, unit.shapes, unit.numels):
                setattr(module, name, unit.full[offset:offset + numel].view(shape))
                offset += numel
            return _cast(args, self.compute_dtype) if self.compute_dtype is not None else None
        return hook

    def _make_post_forward(self, unit: _Unit):
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            self._free(unit)
            if torch.is_grad_enabled():
                tensors = [t for t in tree_leaves(output)
                           if isinstance(t, torch.Tensor) and t.requires_grad]
                if tensors:  # gather again just before this unit's backward (once, whatever the outputs)
                    def pre_backward(grad: torch.Tensor) -> None:
                        if not unit.gathered:
                            self._gather(unit, self._neighbour(unit, -1))
                    for t in tensors:
                        t.register_hook(pre_backward)
        return hook

    def _make_post_backward(self, unit: _Unit):
        @torch.no_grad()
        def hook(full: torch.Tensor) -> None:
            piece = torch.empty_like(unit.shard)
            reduce_scatter_single(piece, full.grad.to(torch.float32), op=dist.ReduceOp.SUM)
            self.n_reduce_scatters += 1
            piece.div_(self.world_size)
            unit.shard.grad = piece if unit.shard.grad is None else unit.shard.grad.add_(piece)
            full.grad = None
            self._free(unit)
        return hook

    # --- the public seam -----------------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = self.module(*args, **kwargs)
        return _cast(out, torch.float32) if self.compute_dtype is not None else out

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        """What the optimizer steps: this rank's fp32 slice of every unit, then the replicated parameters."""
        yield from self.flat_shards
        yield from self.replicated

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> int:
        """All-reduce (average) the replicated gradients; return the number of all-reduces.

        Call once per optimizer step, after the last ``backward()``. Afterwards every
        parameter of :meth:`parameters` has a ``.grad`` of its own shape, in fp32.
        """
        if any(u.gathered or u.pending is not None for u in self.units):
            raise RuntimeError("a unit is still gathered: backward has not reached every unit; FullyShardedDataParallel "
                               "needs every unit to take part in the loss")
        calls = 0
        for p in self.replicated:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(self.world_size)
            calls += 1
        for u in self.units:
            if u.shard.grad is None:
                u.shard.grad = torch.zeros_like(u.shard)
        self.n_all_reduces += calls
        return calls

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter at full size in fp32, named as in the original module (one all-gather per unit)."""
        full: dict[str, torch.Tensor] = {}
        for u in self.units:
            flat = torch.empty(u.slice_numel * self.world_size, dtype=torch.float32, device=u.shard.device)
            all_gather_single(flat, u.shard.detach())
            for name, piece in zip(u.names, flat[:u.numel].split(u.numels)):
                full[f"{u.name}.{name}" if u.name else name] = piece.view(u.shapes[u.names.index(name)]).clone()
        for name, p in self.module.named_parameters():
            full[name] = p.detach().clone()
        return {name: full[name] for name in self._original_names}
