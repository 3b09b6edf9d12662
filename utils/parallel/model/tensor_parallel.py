"""Tensor parallelism (Megatron-LM): linear layers split by columns and by rows, the MLP and attention built from them.

Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models
Using Model Parallelism" (arXiv:1909.08053), section 3. For ``Y = X W`` with
``W = [W_1, ..., W_t]`` split by columns, rank ``r`` computes ``X W_r``, its
slice of the output features; split by rows (``X = [X_1, ..., X_t]`` split
along its columns to match), rank ``r`` computes ``X_r W_r`` and the sum over
ranks is ``Y``. ``nn.Linear`` stores ``W^T`` (out x in), so a column split
slices ``weight`` along dimension 0 and a row split along dimension 1.

The MLP is column-parallel then row-parallel (Figure 3a): the GeLU between them
acts on each rank's own columns, so forward needs one all-reduce, after the
second linear. Attention is split by heads (Figure 3b). Two conjugate operators
(section 3, Figure 3) carry the communication:

* ``f`` (:class:`CopyToTensorParallelRegion`): identity forward, all-reduce backward;
* ``g`` (:class:`ReduceFromTensorParallelRegion`): all-reduce forward, identity backward
  (Korthikanti et al. call this one ``f-bar``, and use ``g`` for the all-gather below).

With sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198, section
4.2.2) ``f`` becomes an all-gather along the sequence fused with the linear
layers behind it, which save only the sequence shard and all-gather it again in
backward (:class:`utils.parallel.model.sequence_parallel.AllGatherLinears`), and ``g``
a reduce-scatter (:mod:`utils.parallel.model.sequence_parallel`). Tensors are
batch-first, ``[batch, seq, hidden]``, as PyTorch's ``SequenceParallel`` style
shards them (``Shard(1)``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from utils.parallel.model.sequence_parallel import all_gather_linears, reduce_scatter_to_sequence_parallel
from utils.validate import check_positive_int

SEQ_DIM = 1  # batch-first activations: [batch, seq, hidden]


class CopyToTensorParallelRegion(torch.autograd.Function):
    """The ``f`` of Megatron-LM (arXiv:1909.08053, section 3): identity in forward, all-reduce in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTensorParallelRegion(torch.autograd.Function):
    """The ``g`` of Megatron-LM (arXiv:1909.08053, section 3): all-reduce in forward, identity in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        out = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def f(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Megatron's ``f``: ``x`` unchanged; in backward the gradient is summed over ``group``."""
    return CopyToTensorParallelRegion.apply(x, group)


def g(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Megatron's ``g``: the sum of ``x`` over ``group``; in backward the gradient passes unchanged."""
    return ReduceFromTensorParallelRegion.apply(x, group)


def shard(tensor: torch.Tensor, dim: int, group: dist.ProcessGroup | None = None, what: str = "size") -> torch.Tensor:
    """This rank's ``1/t`` slice of ``tensor`` along ``dim``, as a detached copy; ``ValueError`` if ``t`` does not divide it."""
    t, rank = dist.get_world_size(group), dist.get_rank(group)
    if tensor.shape[dim] % t:
        raise ValueError(f"tensor parallelism over {t} ranks needs {what} divisible by {t}, got {tensor.shape[dim]}")
    return tensor.detach().chunk(t, dim=dim)[rank].clone()


def _check_linear(linear: nn.Module) -> None:
    if not isinstance(linear, nn.Linear):
        raise ValueError(f"expected a torch.nn.Linear, got {type(linear).__name__}")


class ColumnParallelLinear(nn.Module):
    """This rank's output features of a linear layer: ``X W_r^T + b_r``; the output stays split (not gathered).

    The input enters through ``f``; with ``sequence_parallel`` it is this rank's
    slice of the sequence, all-gathered by :func:`all_gather_linears`, which
    saves only the slice for backward and all-gathers it again there
    (Korthikanti et al. section 4.2.2). ``communicate_input=False`` leaves the
    communication to the caller, for several layers that share one input
    (attention's q, k, v: :class:`TensorParallelSelfAttention`).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group: dist.ProcessGroup | None = None,
                 sequence_parallel: bool = False, communicate_input: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.group, self.sequence_parallel, self.communicate_input = group, sequence_parallel, communicate_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.communicate_input and self.sequence_parallel:
            return all_gather_linears(x, [(self.weight, self.bias)], SEQ_DIM, self.group)[0]
        if self.communicate_input:
            x = f(x, self.group)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """This rank's input features of a linear layer: ``sum_r X_r W_r^T``, then the bias once.

    The input arrives already split (a column-parallel layer's output); the
    partial products are summed by ``g`` (or, with ``sequence_parallel``,
    reduce-scattered along the sequence); the full bias is added after the
    sum, so it is counted once.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group: dist.ProcessGroup | None = None,
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = None if bias is None else nn.Parameter(bias)
        self.group, self.sequence_parallel = group, sequence_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = leave_tensor_parallel_region(F.linear(x, self.weight), self.group, self.sequence_parallel)
        return y if self.bias is None else y + self.bias


def leave_tensor_parallel_region(x: torch.Tensor, group: dist.ProcessGroup | None = None,
                                 sequence_parallel: bool = False) -> torch.Tensor:
    """``g``, or with sequence parallelism the reduce-scatter along the sequence (Korthikanti's ``g-bar``)."""
    return reduce_scatter_to_sequence_parallel(x, SEQ_DIM, group) if sequence_parallel else g(x, group)


def column_parallel(linear: nn.Linear, group: dist.ProcessGroup | None = None, *, sequence_parallel: bool = False,
                    communicate_input: bool = True) -> ColumnParallelLinear:
    """A :class:`ColumnParallelLinear` holding this rank's rows of ``linear.weight`` (its output features) and bias."""
    _check_linear(linear)
    weight = shard(linear.weight, 0, group, "out_features")
    bias = None if linear.bias is None else shard(linear.bias, 0, group, "out_features")
    return ColumnParallelLinear(weight, bias, group, sequence_parallel, communicate_input)


def row_parallel(linear: nn.Linear, group: dist.ProcessGroup | None = None, *,
                 sequence_parallel: bool = False) -> RowParallelLinear:
    """A :class:`RowParallelLinear` holding this rank's columns of ``linear.weight`` (its input features), full bias."""
    _check_linear(linear)
    weight = shard(linear.weight, 1, group, "in_features")
    bias = None if linear.bias is None else linear.bias.detach().clone()
    return RowParallelLinear(weight, bias, group, sequence_parallel)


# --- the two blocks of a transformer layer, full and tensor-parallel ------------------------------------------


class MLP(nn.Module):
    """The transformer MLP, ``GeLU(X A) B`` (``fc1`` = A, ``fc2`` = B), on one device."""

    def __init__(self, hidden: int, ffn_hidden: int | None = None) -> None:
        super().__init__()
        hidden = check_positive_int("hidden", hidden)
        ffn_hidden = check_positive_int("ffn_hidden", 4 * hidden if ffn_hidden is None else ffn_hidden)
        self.fc1, self.fc2 = nn.Linear(hidden, ffn_hidden), nn.Linear(ffn_hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class TensorParallelMLP(nn.Module):
    """Megatron's MLP (arXiv:1909.08053, Figure 3a): ``fc1`` column-parallel, GeLU on each shard, ``fc2`` row-parallel.

    One all-reduce in forward (``g`` after ``fc2``) and one in backward (``f``
    before ``fc1``); with ``sequence_parallel`` an all-gather and a
    reduce-scatter in each direction instead.
    """

    def __init__(self, mlp: MLP, group: dist.ProcessGroup | None = None, sequence_parallel: bool = False) -> None:
        super().__init__()
        self.fc1 = column_parallel(mlp.fc1, group, sequence_parallel=sequence_parallel)
        self.fc2 = row_parallel(mlp.fc2, group, sequence_parallel=sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def _attend_projected(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Causal attention of projected ``[b, s, heads * head_dim]`` queries, keys and values."""
    b, s, _ = q.shape
    heads = [t.view(b, s, -1, head_dim).transpose(1, 2) for t in (q, k, v)]  # [b, heads, s, head_dim]
    y = F.scaled_dot_product_attention(*heads, is_causal=True)
    return y.transpose(1, 2).reshape(b, s, -1)


def _attend(x: torch.Tensor, q: nn.Module, k: nn.Module, v: nn.Module, head_dim: int) -> torch.Tensor:
    """Causal attention over whatever heads ``q``, ``k``, ``v`` produce (all of them, or this rank's)."""
    return _attend_projected(q(x), k(x), v(x), head_dim)


class SelfAttention(nn.Module):
    """Causal multi-head self-attention with separate ``q``, ``k``, ``v`` and ``out`` projections, on one device.

    The head count is read from the projections' width, so the same module runs
    unchanged when PyTorch's ``ColwiseParallel`` leaves each rank ``n_heads / t``
    heads' worth of ``q``, ``k``, ``v`` features.
    """

    def __init__(self, hidden: int, n_heads: int) -> None:
        super().__init__()
        hidden, n_heads = check_positive_int("hidden", hidden), check_positive_int("n_heads", n_heads)
        if hidden % n_heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of n_heads ({n_heads})")
        self.n_heads, self.head_dim = n_heads, hidden // n_heads
        self.q, self.k, self.v, self.out = (nn.Linear(hidden, hidden) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(_attend(x, self.q, self.k, self.v, self.head_dim))


class TensorParallelSelfAttention(nn.Module):
    """Attention split by heads (arXiv:1909.08053, Figure 3b): rank ``r`` owns heads ``r a/t .. (r+1) a/t - 1``.

    ``q``, ``k``, ``v`` are column-parallel (a head's features are contiguous
    output features), ``out`` is row-parallel. One ``f`` serves all three
    projections, so like the MLP it does one all-reduce in forward and one in
    backward; with ``sequence_parallel``, one :func:`all_gather_linears` serves
    them (one all-gather forward; one all-gather and one reduce-scatter
    backward). ``ValueError`` unless ``t`` divides the number of heads.
    """

    def __init__(self, attention: SelfAttention, group: dist.ProcessGroup | None = None,
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        t = dist.get_world_size(group)
        if attention.n_heads % t:
            raise ValueError(f"tensor parallelism over {t} ranks needs n_heads divisible by {t}, "
                             f"got {attention.n_heads}")
        self.group, self.sequence_parallel, self.head_dim = group, sequence_parallel, attention.head_dim
        self.q, self.k, self.v = (column_parallel(m, group, communicate_input=False)
                                  for m in (attention.q, attention.k, attention.v))
        self.out = row_parallel(attention.out, group, sequence_parallel=sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            qkv = all_gather_linears(x, [(m.weight, m.bias) for m in (self.q, self.k, self.v)], SEQ_DIM, self.group)
            return self.out(_attend_projected(*qkv, self.head_dim))
        x = f(x, self.group)
        return self.out(_attend(x, self.q, self.k, self.v, self.head_dim))

