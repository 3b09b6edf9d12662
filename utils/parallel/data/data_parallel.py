"""Data parallelism built from its parts: gradient all-reduce, buckets, ZeRO-1, FSDP2.

N ranks hold the same model, each computes gradients on its 1/N of the batch,
and the gradients are averaged so every rank takes the same step. Because the
loss is a mean, the average of the N shard gradients *is* the full-batch
gradient (for equal shards), so N ranks train the same model as one process on
the whole batch, up to floating-point reordering.

The reference implementations here are what the labs of part 2 check against:

- :func:`all_reduce_gradients`: one all-reduce per parameter after backward.
- :func:`plan_buckets`: DDP's bucketing rule, the same as PyTorch's reducer
  (tested against it); the one rule the chapters, the labs and
  :mod:`utils.parallel.data.overlap` use.
- :class:`BucketedDDP`: gradients packed into those buckets, each all-reduced
  from a gradient hook while backward is still running, as in PyTorch DDP
  (Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel
  Training", VLDB 2020, arXiv:2006.15704, section 3.2).
- :class:`ZeroOneOptimizer`: optimizer state sharded across ranks, ZeRO stage 1
  (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", arXiv:1910.02054, section 5.1).
- :func:`tensor_nbytes`, :func:`optimizer_state_nbytes`: the bytes a rank holds.

The training runs that compare them with PyTorch's own engines (DDP, FSDP2)
and with one process are in :mod:`utils.parallel.data.harness`.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Iterable, Mapping, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from utils.parallel.comm.collectives import all_gather_single, reduce_scatter_single
from utils.validate import check_nonnegative, check_nonnegative_int, check_positive, check_positive_int


def broadcast_parameters(module: nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank, as DDP does at construction."""
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor, src)


def all_reduce_gradients(module: nn.Module) -> int:
    """Average every parameter's gradient over the ranks, one blocking all-reduce per parameter; return the call count.

    ``g <- (1/N) sum_r g_r``: the full-batch gradient when each rank's loss is the
    mean over an equal share of the batch. Parameters without a gradient are skipped.
    """
    world_size = dist.get_world_size()
    calls = 0
    for p in module.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(world_size)
            calls += 1
    return calls


MIB = 2**20

DDP_DEFAULTS: Mapping[str, int] = MappingProxyType({
    # DistributedDataParallel(bucket_cap_mb=None) means 25 MiB (_DEFAULT_BUCKET_CAP_MB = 25).
    "bucket_cap_nbytes": 25 * MIB,
    # With bucket_cap_mb left at None, the first bucket (the last layers' gradients, ready first) is capped
    # at 1 MiB, so the first all-reduce starts early (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES).
    "first_bucket_cap_nbytes": 1 * MIB,
})
"""PyTorch DDP's default bucket caps in bytes (torch/nn/parallel/distributed.py, torch 2.13; tested against it)."""


def plan_buckets(nbytes: Sequence[float], bucket_cap_bytes: float | None = None,
                 first_bucket_cap_bytes: float | None = None) -> list[list[int]]:
    """Group tensors into DDP's gradient buckets: PyTorch's rule, in the order backward fills them.

    ``nbytes[i]`` is the gradient size in bytes of tensor ``i`` in forward
    (``model.parameters()``) order. Backward produces gradients from the last
    to the first, so the walk goes ``i = L-1, ..., 0``: each tensor joins the
    open bucket, and the bucket closes as soon as its size *reaches* the limit
    (``size >= limit``), so a bucket may overshoot by its last tensor and a
    tensor larger than the limit closes a bucket alone. The first bucket's limit
    is ``first_bucket_cap_bytes``, every later one's ``bucket_cap_bytes``.

    This is ``compute_bucket_assignment_by_size`` of PyTorch's reducer
    (torch/csrc/distributed/c10d/reducer.cpp, exposed as
    ``torch.distributed._compute_bucket_assignment_by_size``), called as DDP
    calls it when it rebuilds its buckets after the first iteration, in the order
    the gradients arrived; the tests compare the two. The caps follow
    ``DistributedDataParallel``: ``bucket_cap_bytes=None`` is its
    ``bucket_cap_mb=None``, 25 MiB with a 1 MiB first bucket
    (:data:`DDP_DEFAULTS`); an explicit ``bucket_cap_bytes`` caps the first
    bucket too, unless ``first_bucket_cap_bytes`` says otherwise. DDP buckets
    each dtype and device apart; here all tensors are taken to share one.

    Returns the buckets in launch order, each a list of tensor indices in the
    order their gradients become ready; every index appears exactly once.
    ``float('inf')`` as the cap gives one bucket.
    """
    if bucket_cap_bytes is None:
        bucket_cap_bytes = DDP_DEFAULTS["bucket_cap_nbytes"]
        if first_bucket_cap_bytes is None:
            first_bucket_cap_bytes = DDP_DEFAULTS["first_bucket_cap_nbytes"]
    check_positive("bucket_cap_bytes", bucket_cap_bytes)
    if first_bucket_cap_bytes is not None:
        check_positive("first_bucket_cap_bytes", first_bucket_cap_bytes)
    for i, n in enumerate(nbytes):
        check_nonnegative(f"nbytes[{i}] (a tensor's bytes)", n, finite=True)
    limit = bucket_cap_bytes if first_bucket_cap_bytes is None else first_bucket_cap_bytes
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0.0
    for i in reversed(range(len(nbytes))):
        current.append(i)
        size += nbytes[i]
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0.0, bucket_cap_bytes
    if current:
        buckets.append(current)
    return buckets


class BucketedDDP(nn.Module):
    """Data parallelism with gradient buckets all-reduced asynchronously from gradient hooks.

    A ``register_post_accumulate_grad_hook`` on every parameter counts ready
    gradients; when a bucket is complete (and all earlier buckets have been
    launched, so every rank issues collectives in the same order), its gradients
    are flattened, divided by N and all-reduced with ``async_op=True``. The
    rest of backward overlaps that communication. Call
    :meth:`finish_gradient_synchronization` after ``backward()`` and before
    ``optimizer.step()``: it waits on the handles and copies the averaged
    gradients back. ``n_all_reduce_calls`` counts the all-reduces issued so far.
    The buckets are :func:`plan_buckets`'s, PyTorch's rule; ``bucket_cap_bytes=None``
    gives DDP's default caps (25 MiB, the first bucket 1 MiB).
    """

    def __init__(self, module: nn.Module, bucket_cap_bytes: float | None = None) -> None:
        super().__init__()
        self.module = module
        self.world_size = dist.get_world_size()
        broadcast_parameters(module)
        params = [p for p in module.parameters() if p.requires_grad]
        plan = plan_buckets([p.numel() * p.element_size() for p in params], bucket_cap_bytes)
        self.buckets = [[params[i] for i in bucket] for bucket in plan]
        self._bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self._ready = [0] * len(self.buckets)
        self._next_to_launch = 0
        self._pending: list[tuple[int, torch.Tensor, Any]] = []
        self.n_all_reduce_calls = 0
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_gradient_ready)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def _on_gradient_ready(self, param: torch.Tensor) -> None:
        b = self._bucket_of[id(param)]
        self._ready[b] += 1
        while (self._next_to_launch < len(self.buckets)
               and self._ready[self._next_to_launch] == len(self.buckets[self._next_to_launch])):
            bucket = self.buckets[self._next_to_launch]
            flat = torch.cat([p.grad.reshape(-1) for p in bucket]).div_(self.world_size)
            work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
            self._pending.append((self._next_to_launch, flat, work))
            self.n_all_reduce_calls += 1
            self._next_to_launch += 1

    def finish_gradient_synchronization(self) -> int:
        """Wait for every bucket's all-reduce, write the averaged gradients into ``p.grad``; return the call count.

        The count is the number of all-reduces this backward pass launched (one per bucket).
        """
        if self._next_to_launch != len(self.buckets):
            raise RuntimeError(f"only {self._next_to_launch} of {len(self.buckets)} buckets were all-reduced: "
                               "some parameters received no gradient in this backward pass; BucketedDDP "
                               "needs every parameter to take part in the loss")
        for b, flat, work in self._pending:
            work.wait()
            offset = 0
            for p in self.buckets[b]:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
        calls = len(self._pending)
        self._pending.clear()
        self._ready = [0] * len(self.buckets)
        self._next_to_launch = 0
        return calls


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    """The ``[start, stop)`` of a flat vector of ``numel`` elements that rank ``rank`` owns.

    Shards have ``ceil(numel / N)`` elements (the vector is padded to ``N`` of
    them, so collectives see equal sizes); the last shards may be short or empty.
    """
    check_nonnegative_int("numel", numel)
    check_positive_int("world_size", world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    size = -(-numel // world_size)
    return min(rank * size, numel), min((rank + 1) * size, numel)


def trainable_parameters(params: Iterable[torch.Tensor], owner: str) -> list[torch.Tensor]:
    """The parameters of ``params`` that require a gradient, all in one dtype on one device, as a sharded
    optimizer (``owner``, named in the errors) needs them to flatten them into one buffer."""
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise ValueError(f"{owner} got no parameters that require a gradient")
    if len({(p.dtype, p.device) for p in trainable}) != 1:
        raise ValueError(f"{owner} needs all parameters in one dtype on one device, got "
                         f"{sorted({(str(p.dtype), str(p.device)) for p in trainable})}")
    return trainable


class ZeroOneOptimizer:
    """ZeRO stage 1: each rank keeps optimizer state only for its ``1/N`` slice of the flattened parameters.

    ``step()``: flatten the (local, unaveraged) gradients; reduce-scatter them so
    rank r receives the sum over ranks of its slice, divide by N; run the inner
    optimizer (``optimizer_cls``, Adam by default) on the slice; all-gather the
    updated slices back into every parameter. Reduce-scatter plus all-gather
    move the same bytes as one all-reduce (arXiv:1910.02054, section 7.2.1).
    The slice is kept as an ``nn.Parameter`` copy in the parameters' own dtype,
    and the inner optimizer's state is created for it alone. With fp32
    parameters (as in the labs) that copy is the fp32 master slice of ZeRO's
    mixed-precision count. With 16-bit parameters there is no fp32 master copy
    here: the update is done in 16 bits, and a faithful mixed-precision ZeRO-1
    would keep ``shard`` in fp32 and round it to 16 bits before the all-gather.
    The collectives are the flat-tensor ones (``reduce_scatter_tensor`` and
    ``all_gather_into_tensor``, under this torch's names, see
    :mod:`utils.parallel.comm.collectives`).
    """

    def __init__(self, params: Iterable[torch.Tensor], optimizer_cls: type = torch.optim.Adam,
                 **optimizer_kwargs: Any) -> None:
        self.params = trainable_parameters(params, "ZeroOneOptimizer")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = -(-self.numel // self.world_size)
        start = self.rank * self.shard_numel
        with torch.no_grad():
            flat = self._flatten([p for p in self.params])
            self.shard = nn.Parameter(flat[start:start + self.shard_numel].clone())
        self.optimizer = optimizer_cls([self.shard], **optimizer_kwargs)

    def _flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """One flat vector of ``N * shard_numel`` elements: the tensors, then zeros as padding."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return F.pad(flat, (0, self.shard_numel * self.world_size - self.numel))

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        grad_shard = torch.empty_like(self.shard)
        reduce_scatter_single(grad_shard, self._flatten(grads), op=dist.ReduceOp.SUM)
        self.shard.grad = grad_shard.div_(self.world_size)
        self.optimizer.step()
        full = torch.empty(self.shard_numel * self.world_size, dtype=self.shard.dtype, device=self.shard.device)
        all_gather_single(full, self.shard.detach())
        offset = 0
        for p in self.params:
            p.copy_(full[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def _local(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` stored on this rank (a DTensor's local shard, or ``t`` itself)."""
    return t.to_local() if hasattr(t, "to_local") else t


def tensor_nbytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes this rank stores for ``tensors`` (``None`` entries skipped; DTensors count their local shard)."""
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors if t is not None)


def optimizer_state_nbytes(optimizer: Any) -> int:
    """Bytes of per-element optimizer state on this rank (Adam: ``exp_avg`` and ``exp_avg_sq``).

    0-dimensional bookkeeping such as Adam's ``step`` counter is not counted: it
    does not grow with the model. Accepts a :class:`ZeroOneOptimizer` too.
    """
    inner = optimizer.optimizer if isinstance(optimizer, ZeroOneOptimizer) else optimizer
    return tensor_nbytes(v for state in inner.state.values() for v in state.values()
                         if isinstance(v, torch.Tensor) and v.dim() > 0)
