"""Part 3's LLaMA block, tensor-parallel with sequence parallelism, from part 2's pieces.

Megatron-LM's split (Shoeybi et al. 2019, arXiv:1909.08053, section 3) applied to
:class:`utils.attention.llama.Block`, with Korthikanti et al.'s sequence parallelism (2022,
arXiv:2205.05198, section 4.2.2) between the two halves. On a group of ``t`` ranks, rank ``r`` holds:

- the query heads ``r n_h / t .. (r + 1) n_h / t - 1`` and the key/value heads
  ``r n_kv / t .. (r + 1) n_kv / t - 1`` (contiguous rows of ``wq``, ``wk``, ``wv``): with grouped-query
  attention each query head's key/value head is then on the same rank, so attention needs no
  communication; ``wo``'s matching columns;
- ``1/t`` of SwiGLU's hidden units: rows of ``w1`` and ``w3``, columns of ``w2``;
- both RMSNorm weights whole, applied to its ``1/t`` of the sequence;
- activations between the halves as its slice of the sequence, ``(batch, seq / t, dim)``.

Each half enters with one all-gather of the sequence feeding its column-parallel matmuls
(:func:`utils.parallel.model.sequence_parallel.all_gather_linears`, which saves only the slice for
backward) and leaves with one reduce-scatter of its row-parallel matmul's partial sums
(:func:`~utils.parallel.model.sequence_parallel.reduce_scatter_to_sequence_parallel`). The norms'
weights see only their rank's tokens, so their gradients are summed over the group after backward
(:func:`~utils.parallel.model.sequence_parallel.all_reduce_replicated_grads`). Rotary positions are
those of the whole gathered sequence.

With a context-parallel group (``cp_group``), the sequence the tensor-parallel group gathers is one
share of the whole (in ``cp_layout``, zig-zag by default, so that causal work is balanced), and
attention runs as ring attention over ``cp_group`` (Liu et al. 2023, arXiv:2310.01889) on this rank's
heads; rotary angles are looked up at the share's global positions.

Equal to the block on one process up to the order of floating-point sums (tests/capstone).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from utils.attention.llama import Block, rms_norm
from utils.attention.rope import apply_rope, compute_dtype, rope_angles
from utils.parallel.frontier.context_parallel import ring_attention
from utils.parallel.model.sequence_parallel import all_gather_linears, reduce_scatter_to_sequence_parallel
from utils.parallel.model.tensor_parallel import shard

SEQ_DIM = 1


class TensorParallelBlock(nn.Module):
    """This rank's shard of ``block`` on ``group``; ``forward`` takes and returns this rank's sequence slice."""

    def __init__(self, block: Block, group: dist.ProcessGroup | None = None,
                 cp_group: dist.ProcessGroup | None = None, cp_layout: str = "zigzag") -> None:
        super().__init__()
        self.cp_group, self.cp_layout = cp_group, cp_layout
        c, t = block.config, dist.get_world_size(group)
        for what, n in (("n_heads", c.n_heads), ("n_kv_heads", c.n_kv_heads), ("the SwiGLU hidden size", c.hidden)):
            if n % t:
                raise ValueError(f"tensor parallelism over {t} ranks needs {what} divisible by {t}, got {n} "
                                 "(replicating key/value heads is not supported here)")
        self.config, self.group, self.t = c, group, t
        self.n_heads, self.n_kv_heads = c.n_heads // t, c.n_kv_heads // t
        self.attn_norm = nn.Parameter(block.attn_norm.detach().clone())
        self.ffn_norm = nn.Parameter(block.ffn_norm.detach().clone())
        a = block.attn
        self.wq, self.wk, self.wv = (nn.Parameter(shard(m.weight, 0, group)) for m in (a.wq, a.wk, a.wv))
        self.wo = nn.Parameter(shard(a.wo.weight, 1, group))
        self.w1, self.w3 = nn.Parameter(shard(block.w1.weight, 0, group)), nn.Parameter(shard(block.w3.weight, 0, group))
        self.w2 = nn.Parameter(shard(block.w2.weight, 1, group))

    def replicated_parameters(self) -> list[nn.Parameter]:
        """The parameters every rank holds whole: their gradients must be summed over the group."""
        return [self.attn_norm, self.ffn_norm]

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Causal grouped-query attention for this rank's heads over the whole sequence, as part 3's ``Attention``.

        Without a context-parallel group the gathered sequence is the whole sequence; with one it is this
        rank's share of it, and :func:`~utils.parallel.frontier.context_parallel.ring_attention` brings the
        other shares' keys and values around the ring.
        """
        c, (b, s, _) = self.config, q.shape
        q = q.view(b, s, self.n_heads, c.head_dim).transpose(1, 2)
        k = k.view(b, s, self.n_kv_heads, c.head_dim).transpose(1, 2)
        v = v.view(b, s, self.n_kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = rope_angles(int(positions.max()) + 1, c.head_dim, c.rope_base, device=q.device,
                               dtype=compute_dtype(q.dtype))
        cos, sin = cos[positions], sin[positions]
        q, k = apply_rope(q, cos, sin, c.rope_layout), apply_rope(k, cos, sin, c.rope_layout)
        if self.cp_group is not None:
            out = ring_attention(q, k, v, causal=True, group=self.cp_group, layout=self.cp_layout)
        else:
            group = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            scores = q @ k.transpose(-2, -1) / math.sqrt(c.head_dim)
            future = positions[None, :] > positions[:, None]
            out = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
        return out.transpose(1, 2).reshape(b, s, -1)

    def forward(self, x_local: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """This rank's slice of the block's output; ``positions`` are the global positions of the gathered
        sequence (default ``0 .. s - 1``; with context parallelism, those of this rank's share, in its layout)."""
        c, group = self.config, self.group
        if positions is None:
            positions = torch.arange(x_local.shape[SEQ_DIM] * self.t, device=x_local.device)
        q, k, v = all_gather_linears(rms_norm(x_local, self.attn_norm, c.eps),
                                     [(self.wq, None), (self.wk, None), (self.wv, None)], SEQ_DIM, group)
        h = x_local + reduce_scatter_to_sequence_parallel(F.linear(self._attention(q, k, v, positions), self.wo), SEQ_DIM, group)
        gate, up = all_gather_linears(rms_norm(h, self.ffn_norm, c.eps), [(self.w1, None), (self.w3, None)],
                                      SEQ_DIM, group)
        return h + reduce_scatter_to_sequence_parallel(F.linear(F.silu(gate) * up, self.w2), SEQ_DIM, group)
