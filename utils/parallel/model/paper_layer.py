"""A GPT layer built the way Korthikanti et al. count its activations: on one process, and tensor + sequence parallel.

Korthikanti et al. (arXiv:2205.05198), section 4, Figures 2-5: a pre-LayerNorm
layer in 16-bit with 1-byte dropout masks and an explicit softmax stores
``sbh (34 + 5as/h)`` bytes for backward; split over ``t`` ranks with tensor and
sequence parallelism, ``sbh (34/t + 5as/(ht))`` per rank (Table 2). The
second needs every piece of the recipe: the LayerNorms, dropouts and residual
additions on ``s/t`` tokens, Q, K, V and the MLP's first linear behind
:func:`utils.parallel.model.sequence_parallel.all_gather_linears` (which saves the
slice), and the row-parallel outputs reduce-scattered back to the slices.
Every dropout draws this rank's own masks: with sequence parallelism even the
residual stream holds different tokens on each rank, so Megatron-LM runs the
whole block inside its model-parallel RNG stream
(``megatron/core/transformer/transformer_block.py``; :mod:`utils.parallel.model.dropout_rng`).
Besides, LayerNorm keeps its mean and 1/std (``sb`` elements each), which
the paper neglects.

Activations are sequence-first, ``[s, b, h]``, as in Megatron-LM. Dropout is
``torch.native_dropout``, which keeps a bool mask (1 byte an element) on any
device, like the fused CUDA kernel the paper assumes.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from utils.parallel.model.dropout_rng import RNGStatesTracker
from utils.parallel.model.sequence_parallel import all_gather_linears, reduce_scatter_to_sequence_parallel
from utils.parallel.model.tensor_parallel import shard
from utils.validate import check_positive_int

SEQ_DIM = 0  # [s, b, h]


def _dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    return torch.native_dropout(x, p, True)[0]


def _attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int, p: float) -> torch.Tensor:
    """Causal ``dropout(softmax(QK^T / sqrt(d))) V`` over the heads in ``q``, ``k``, ``v`` (``[s, b, heads * d]``)."""
    s, b, _ = q.shape
    q, k, v = (t.reshape(s, b, -1, head_dim).permute(1, 2, 0, 3) for t in (q, k, v))  # [b, heads, s, d]
    causal = torch.full((s, s), float("-inf"), dtype=q.dtype, device=q.device).triu(1)
    probs = _dropout(torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(head_dim) + causal, dim=-1), p)
    return (probs @ v).permute(2, 0, 1, 3).reshape(s, b, -1)


class PaperLayer(nn.Module):
    """The layer of Korthikanti et al. Figure 2 on one process: ``x + drop(attn(ln1 x))``, then ``+ drop(mlp(ln2 x))``."""

    def __init__(self, hidden: int, n_heads: int, p_drop: float = 0.1) -> None:
        super().__init__()
        hidden, n_heads = check_positive_int("hidden", hidden), check_positive_int("n_heads", n_heads)
        if hidden % n_heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of n_heads ({n_heads})")
        if not 0.0 <= p_drop < 1.0:
            raise ValueError(f"p_drop must be in [0, 1), got {p_drop}")
        self.n_heads, self.head_dim, self.p_drop = n_heads, hidden // n_heads, p_drop
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.q, self.k, self.v, self.proj = (nn.Linear(hidden, hidden) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        ctx = _attention_core(self.q(h), self.k(h), self.v(h), self.head_dim, self.p_drop)
        x = x + _dropout(self.proj(ctx), self.p_drop)
        return x + _dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), self.p_drop)


class SequenceParallelPaperLayer(nn.Module):
    """:class:`PaperLayer` over the ranks of ``group``, tensor + sequence parallel; takes and returns ``[s/t, b, h]``.

    Per rank: the LayerNorms (whole copies; their gradients are partial sums to
    all-reduce, :func:`utils.parallel.model.sequence_parallel.all_reduce_replicated_grads`),
    ``a/t`` heads, ``4h/t`` MLP columns, the whole biases of ``proj`` and ``fc2``.
    Communication: 2 all-gathers and 2 reduce-scatters in forward, 4 and 2 in backward.
    """

    def __init__(self, layer: PaperLayer, group: dist.ProcessGroup | None = None,
                 tracker: RNGStatesTracker | None = None) -> None:
        super().__init__()
        t = dist.get_world_size(group)
        if layer.n_heads % t:
            raise ValueError(f"tensor parallelism over {t} ranks needs n_heads divisible by {t}, got {layer.n_heads}")
        self.group, self.tracker, self.head_dim, self.p_drop = group, tracker, layer.head_dim, layer.p_drop
        self.ln1, self.ln2 = (nn.LayerNorm(layer.ln1.normalized_shape) for _ in range(2))
        self.ln1.load_state_dict(layer.ln1.state_dict())
        self.ln2.load_state_dict(layer.ln2.state_dict())
        cols = lambda m: (nn.Parameter(shard(m.weight, 0, group)), nn.Parameter(shard(m.bias, 0, group)))  # noqa: E731
        (self.q_w, self.q_b), (self.k_w, self.k_b), (self.v_w, self.v_b) = (cols(m) for m in (layer.q, layer.k, layer.v))
        self.fc1_w, self.fc1_b = cols(layer.fc1)
        self.proj_w, self.fc2_w = (nn.Parameter(shard(m.weight, 1, group)) for m in (layer.proj, layer.fc2))
        self.proj_b, self.fc2_b = (nn.Parameter(m.bias.detach().clone()) for m in (layer.proj, layer.fc2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.tracker.fork() if self.tracker is not None else contextlib.nullcontext():
            return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = all_gather_linears(self.ln1(x), [(self.q_w, self.q_b), (self.k_w, self.k_b), (self.v_w, self.v_b)],
                                     SEQ_DIM, self.group)
        ctx = _attention_core(q, k, v, self.head_dim, self.p_drop)
        out = reduce_scatter_to_sequence_parallel(F.linear(ctx, self.proj_w), SEQ_DIM, self.group) + self.proj_b
        x = x + _dropout(out, self.p_drop)
        (u,) = all_gather_linears(self.ln2(x), [(self.fc1_w, self.fc1_b)], SEQ_DIM, self.group)
        y = reduce_scatter_to_sequence_parallel(F.linear(F.gelu(u), self.fc2_w), SEQ_DIM, self.group) + self.fc2_b
        return x + _dropout(y, self.p_drop)
