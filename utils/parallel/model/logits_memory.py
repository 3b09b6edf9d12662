"""The logits of a large vocabulary: their bytes, and a cross-entropy that never holds them all at once.

The output layer turns each of the ``b s`` positions of a micro-batch into
``V`` logits. Cross-entropy is computed in fp32 for accuracy, so the logits
alone take ``4 b s V`` bytes (``4 b s V / t`` with the vocabulary split over
t tensor-parallel ranks), and backward needs a gradient of the same size.
Korthikanti et al. (arXiv:2205.05198, section 4.3) count this ``4sbv/t`` term
for the last pipeline stage; with Llama 3's vocabulary of 128,000 (Llama Team,
arXiv:2407.21783, Table 3) and 8,192-token sequences it is 4.2 GB per
sequence before any split.

:func:`chunked_cross_entropy` computes the mean cross-entropy of
``hidden @ weight.T`` against integer targets in chunks of ``chunk_rows``
positions: each chunk's logits are made, reduced to one log-sum-exp per row,
and freed; backward makes them again, one chunk at a time, and turns them into
``softmax - one_hot``, from which the gradients of ``hidden`` and ``weight``
follow. Only ``chunk_rows x V`` logits live at once, at the price of a second
logit matmul in backward (the same trade as activation recomputation). It is
the idea behind the chunked or "fused linear" cross-entropy losses of
training libraries; here it is written out in PyTorch.
"""

from __future__ import annotations

import torch

from utils.validate import check_positive_int


def logits_bytes(micro_batch: int, seq_len: int, vocab: int, tp: int = 1, element_bytes: int = 4) -> int:
    """``element_bytes * b * s * V / t``: the bytes of one micro-batch's logits on one GPU (fp32 by default).

    The vocabulary is split over the ``tp`` tensor-parallel ranks (Megatron's
    vocabulary-parallel output layer), so ``vocab`` must be a multiple of ``tp``.
    """
    for name, value in (("micro_batch", micro_batch), ("seq_len", seq_len), ("vocab", vocab), ("tp", tp),
                        ("element_bytes", element_bytes)):
        check_positive_int(name, value)
    if vocab % tp:
        raise ValueError(f"vocab ({vocab}) must be a multiple of tp ({tp}): each rank holds vocab / tp columns")
    return element_bytes * micro_batch * seq_len * vocab // tp


def _check(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_rows: int) -> None:
    check_positive_int("chunk_rows", chunk_rows)
    if hidden.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"hidden must be (N, h) and weight (V, h), got shapes {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)}")
    if hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden has {hidden.shape[1]} features but weight has {weight.shape[1]}; they must agree")
    if targets.shape != (hidden.shape[0],) or targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"targets must be integer class indices of shape ({hidden.shape[0]},), got "
                         f"{targets.dtype} of shape {tuple(targets.shape)}")
    if hidden.shape[0] == 0:
        raise ValueError("hidden must hold at least one row")
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= weight.shape[0]):
        raise ValueError(f"targets must lie in [0, {weight.shape[0]}), the vocabulary")


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weight.T``, chunk by chunk; backward recomputes each chunk's logits."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_rows):
        n = hidden.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, n, chunk_rows):
            rows = slice(start, min(start + chunk_rows, n))
            logits = (hidden[rows] @ weight.T).float()  # chunk_rows x V, freed at the end of the iteration
            lse[rows] = torch.logsumexp(logits, dim=-1)
            total += (lse[rows] - logits.gather(1, targets[rows, None]).squeeze(1)).sum()
            del logits
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk_rows = chunk_rows
        return total / n

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, targets, lse = ctx.saved_tensors
        n, chunk_rows = hidden.shape[0], ctx.chunk_rows
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        for start in range(0, n, chunk_rows):
            rows = slice(start, min(start + chunk_rows, n))
            logits = (hidden[rows] @ weight.T).float()
            dlogits = logits.sub_(lse[rows, None]).exp_()  # the softmax, in place of the logits
            dlogits[torch.arange(dlogits.shape[0], device=dlogits.device), targets[rows]] -= 1.0
            dlogits *= grad_loss / n
            dlogits = dlogits.to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = dlogits @ weight
            if grad_weight is not None:
                grad_weight += (dlogits.T @ hidden[rows]).float()
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk_rows: int = 1024) -> torch.Tensor:
    """``F.cross_entropy(hidden @ weight.T, targets)`` (mean), holding at most ``chunk_rows x V`` logits at once.

    ``hidden`` is (N, h), the final hidden states of N positions; ``weight`` is
    (V, h), the output layer; ``targets`` (N,) the next tokens. The logits are
    computed in ``hidden``'s dtype and reduced in fp32. Backward recomputes
    each chunk's logits from ``hidden`` and ``weight``: ``d loss / d logits =
    (softmax - one_hot) / N``.
    """
    _check(hidden, weight, targets, chunk_rows)
    return _ChunkedCrossEntropy.apply(hidden, weight, targets.long(), chunk_rows)
