"""The vocabulary split over tensor-parallel ranks: the embedding and the cross-entropy (Megatron-LM, section 3).

Shoeybi et al. (arXiv:1909.08053), section 3, last paragraphs: the input
embedding ``E`` (``v x h``) is split along the vocabulary, rank ``r`` holding
rows ``[r v/t, (r+1) v/t)``. A rank looks up the tokens that fall in its range,
writes zeros for the others, and an all-reduce (Megatron's ``g``) sums the
``t`` partial embeddings: exactly one rank contributed each token's row.

The output layer shares ``E`` (weight tying), so it is column-parallel over the
vocabulary: rank ``r`` computes its ``v/t`` logits of every token. Gathering
them for the softmax would move ``b s v`` values; instead each rank reduces its
shard to a few numbers per token and the ranks all-reduce those, ``b s``
scalars each (the paper: "reduces the communication to b x s instead of
b x s x v"). Megatron-LM's ``_VocabParallelCrossEntropy``
(``megatron/core/tensor_parallel/cross_entropy.py``) does three all-reduces:

1. the maximum logit of each token (``MAX``), subtracted for a stable exponential;
2. the target's logit, which exactly one rank holds (the others contribute 0);
3. the sum of the exponentials over the whole vocabulary.

The loss is ``log(sum_j exp(z_j - m)) - (z_target - m)``. Its gradient with
respect to a rank's logits is local: ``softmax(z)_j - [j = target]`` for the
rank's ``j``, so backward needs no communication.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from utils.parallel.model.tensor_parallel import g, shard


def vocab_range(vocab: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[start, end)``: the token ids rank ``rank`` of ``world_size`` holds of a ``vocab``-row table.

    Raises ``ValueError`` unless ``world_size`` divides ``vocab`` (Megatron-LM
    pads the vocabulary to a multiple of ``128 t`` for this,
    ``--make-vocab-size-divisible-by``) and ``0 <= rank < world_size``.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank {rank} of {world_size}")
    if vocab < 1 or vocab % world_size:
        raise ValueError(f"a vocabulary of {vocab} does not split over {world_size} ranks: pad it to a multiple")
    per_rank = vocab // world_size
    return rank * per_rank, (rank + 1) * per_rank


class VocabParallelEmbedding(nn.Module):
    """This rank's ``v/t`` rows of an embedding; the full embedding of any token after one all-reduce."""

    def __init__(self, embedding: nn.Embedding, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        if not isinstance(embedding, nn.Embedding):
            raise ValueError(f"expected a torch.nn.Embedding, got {type(embedding).__name__}")
        t, rank = dist.get_world_size(group), dist.get_rank(group)
        self.start, self.end = vocab_range(embedding.num_embeddings, rank, t)
        self.weight = nn.Parameter(shard(embedding.weight, 0, group, "num_embeddings"))
        self.group = group

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        outside = (tokens < self.start) | (tokens >= self.end)
        local = F.embedding((tokens - self.start).masked_fill(outside, 0), self.weight)
        return g(local.masked_fill(outside.unsqueeze(-1), 0.0), self.group)


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of vocabulary-sharded logits: three all-reduces of ``b s`` scalars, none backward."""

    @staticmethod
    def forward(ctx, local_logits: torch.Tensor, target: torch.Tensor, group: dist.ProcessGroup | None):
        start, end = vocab_range(local_logits.shape[-1] * dist.get_world_size(group), dist.get_rank(group),
                                 dist.get_world_size(group))
        logits = local_logits.float()
        top = logits.amax(dim=-1)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)  # 1: the largest logit of each token
        shifted = logits - top.unsqueeze(-1)
        outside = (target < start) | (target >= end)
        index = (target - start).masked_fill(outside, 0)
        target_logit = shifted.gather(-1, index.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        dist.all_reduce(target_logit, group=group)  # 2: the target's logit, from the one rank that holds it
        exp = shifted.exp()
        sum_exp = exp.sum(dim=-1)
        dist.all_reduce(sum_exp, group=group)  # 3: the softmax denominator over the whole vocabulary
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, index, outside)
        ctx.dtype = local_logits.dtype
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        softmax, index, outside = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, index.unsqueeze(-1), -(~outside).to(grad.dtype).unsqueeze(-1))
        return (grad * grad_loss.unsqueeze(-1)).to(ctx.dtype), None, None


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, target: torch.Tensor,
                                 group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Per-token ``-log softmax(z)[target]`` when each rank holds ``v/t`` consecutive logits of every token.

    ``local_logits`` is ``[..., v/t]``, this rank's slice of the vocabulary in
    rank order; ``target`` is ``[...]`` of global token ids. Returns the loss of
    each token (float32), equal on every rank. ``ValueError`` if the shapes do not match.
    """
    if local_logits.shape[:-1] != target.shape:
        raise ValueError(f"logits {tuple(local_logits.shape)} need a target of shape {tuple(local_logits.shape[:-1])}, "
                         f"got {tuple(target.shape)}")
    return VocabParallelCrossEntropy.apply(local_logits, target, group)


def cross_entropy_communication_elements(batch: int, seq_len: int, vocab: int) -> dict[str, int]:
    """Elements each rank contributes to the loss's collectives: the logits gathered, or 3 scalars per token.

    ``gather``: an all-gather of the logits before an ordinary softmax, ``b s v``
    elements in the output buffer; ``vocab_parallel``: Megatron-LM's three
    all-reduces of ``b s`` scalars (section 3).
    """
    for name, value in (("batch", batch), ("seq_len", seq_len), ("vocab", vocab)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return {"gather": batch * seq_len * vocab, "vocab_parallel": 3 * batch * seq_len}
