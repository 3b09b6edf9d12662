"""Fused linear + cross-entropy: the mean loss of ``hidden @ weight.T`` and both gradients, without all the logits.

The output layer of a language model turns ``N`` hidden states of width ``d`` into ``N x V`` logits; with
``V = 128,000`` the fp32 logits outweigh the rest of the step's activations. Cross-entropy reduces each row
to one number, and its gradient with respect to the logits is known in closed form:

    loss = (1 / N_valid) sum_i (lse_i - z_i,y_i),  lse_i = log sum_j exp(z_ij),
    d loss / d z_ij = (softmax(z_i)_j - [j == y_i]) / N_valid

(rows whose target is ``ignore_index`` contribute nothing, and ``N_valid`` counts the others, as in
``F.cross_entropy``). So the forward pass can produce the gradients at once, ``chunk_size`` tokens at a time:

1. ``z = hidden[c] @ weight.T``, a ``chunk_size x V`` fp32 buffer, reused for every chunk;
2. :func:`cross_entropy_grad_kernel`, one program per row, reads the row twice: an online softmax
   (Milakov and Gimelshein, arXiv:1805.02867) keeps the running max ``m`` and the running sum
   ``s = sum exp(z - m)`` block by block, so ``lse = m + log s`` for any ``V``; the second sweep writes
   ``(exp(z - lse) - one_hot) / N_valid`` over the logits, in place, and the row's loss ``lse - z_y``;
3. ``grad_hidden[c] = grad_z @ weight`` and ``grad_weight += grad_z.T @ hidden[c]`` (fp32 accumulator).

Backward only multiplies the two stored gradients by the upstream scalar. No ``N x V`` tensor ever exists:
the logits held at once are :func:`peak_logits_nbytes`, against ``4 N V`` for the fp32 logits alone unfused.

This is the design of Liger-Kernel's ``LigerFusedLinearCrossEntropyFunction`` (linkedin/Liger-Kernel,
``src/liger_kernel/ops/fused_linear_cross_entropy.py`` at 00eba634, kernel ``liger_cross_entropy_kernel``
in ``src/liger_kernel/ops/cross_entropy.py`` at 02e90db9; after mgmalek/efficient_cross_entropy), written
anew and smaller. What differs: the buffer the kernel sees is always fp32 (Liger keeps bf16 logits and writes
a bf16 gradient into them), so bf16 inputs also run under Triton's interpreter, which reads bf16 as zeros,
at ``4 + 2`` bytes per logit instead of 2; the one-hot is subtracted inside the second sweep
(``tl.where(cols == y, ...)``) instead of re-reading ``z_y`` after a ``tl.debug_barrier``; ``grad_weight``
always accumulates in fp32 (Liger: in the weight's dtype unless ``accum_dtype`` is given); backward scales
out of place, so ``retain_graph`` twice gives the same gradient twice; ``chunk_size`` is the caller's
(Liger picks ``next_power_of_2(N / ceil(V / d))``, so the chunk's logits weigh about as much as ``hidden``);
no bias, label smoothing, z-loss, softcap or ``reduction='none'``.

The book's PyTorch version, :func:`utils.parallel.model.logits_memory.chunked_cross_entropy`, makes the same
chunks but keeps only the log-sum-exp in forward and recomputes every chunk's logits in backward: one more
``2 N d V`` matmul, and nothing of the size of ``weight`` held between forward and backward. The fused version
spends memory (``grad_hidden`` and ``grad_weight`` live from forward to backward, as in Liger) to skip that
matmul. The stored gradients are those of this loss at these inputs: any scalar function of the loss still
differentiates correctly (``d f(loss) / d hidden = f'(loss) * grad_hidden``, which backward applies), but
changing ``hidden`` or ``weight`` in place between forward and backward goes unnoticed, since neither is saved.
"""

from __future__ import annotations

from numbers import Integral

import torch

from utils.device import device
from utils.kernels.softmax import num_warps_for
from utils.kernels.triton_or_stand_in import tl, triton
from utils.validate import check_positive_int

DTYPES = (torch.float32, torch.bfloat16)
"""Input dtypes of ``hidden`` and ``weight``; the loss, the softmax and ``grad_weight``'s sum are fp32 either way."""

MAX_BLOCK_SIZE = 4096
"""Most logits one program holds per step of its row loop, with :func:`utils.kernels.softmax.num_warps_for` warps
(4 at 4096; untuned here, and Liger uses up to 32768 with 32 warps)."""


@triton.jit
def cross_entropy_grad_kernel(logits_ptr, targets_ptr, loss_ptr, row_stride, n_cols, ignore_index, inv_n_valid,
                              BLOCK_SIZE: tl.constexpr, WRITE_GRAD: tl.constexpr):
    """Program ``row``: ``loss[row] = lse - z[y]`` by an online softmax, then, if ``WRITE_GRAD``,
    ``z <- (softmax(z) - one_hot(y)) * inv_n_valid`` in place.

    A row whose target is ``ignore_index`` gets loss 0 and a zero gradient.
    """
    row = tl.program_id(axis=0).to(tl.int64)  # row * row_stride can pass 2**31 for a large chunk and vocabulary
    row_ptr = logits_ptr + row * row_stride
    target = tl.load(targets_ptr + row)
    if target == ignore_index:
        if WRITE_GRAD:
            for start in range(0, n_cols, BLOCK_SIZE):
                cols = start + tl.arange(0, BLOCK_SIZE)
                tl.store(row_ptr + cols, tl.zeros((BLOCK_SIZE,), dtype=tl.float32), mask=cols < n_cols)
        tl.store(loss_ptr + row, 0.0)
    else:
        m = -float("inf")  # running max
        s = 0.0            # running sum of exp(z - m)
        z_target = 0.0
        for start in range(0, n_cols, BLOCK_SIZE):
            cols = start + tl.arange(0, BLOCK_SIZE)
            mask = cols < n_cols
            z = tl.load(row_ptr + cols, mask=mask, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(z, axis=0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
            m = m_new
            z_target += tl.sum(tl.where(cols == target, z, 0.0), axis=0)
        lse = m + tl.log(s)
        tl.store(loss_ptr + row, lse - z_target)
        if WRITE_GRAD:
            for start in range(0, n_cols, BLOCK_SIZE):
                cols = start + tl.arange(0, BLOCK_SIZE)
                mask = cols < n_cols
                z = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                grad = (tl.exp(z - lse) - tl.where(cols == target, 1.0, 0.0)) * inv_n_valid
                tl.store(row_ptr + cols, grad, mask=mask)


def _check(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_size: int,
           ignore_index: int) -> None:
    """Raise ``ValueError`` naming what is wrong with the inputs of :func:`fused_linear_cross_entropy`."""
    for name, t in (("hidden", hidden), ("weight", weight), ("targets", targets)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} is a {type(t).__name__}, expected a torch.Tensor")
    check_positive_int("chunk_size", chunk_size)
    if not isinstance(ignore_index, Integral) or isinstance(ignore_index, bool):
        raise ValueError(f"ignore_index must be an int (the target value to skip, -100 by default), "
                         f"got {ignore_index!r}")
    if hidden.dim() != 2 or weight.dim() != 2 or targets.dim() != 1:
        raise ValueError(f"hidden must be (tokens, d), weight (vocab, d) and targets (tokens,); got shapes "
                         f"{tuple(hidden.shape)}, {tuple(weight.shape)} and {tuple(targets.shape)}")
    if hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden has d = {hidden.shape[1]} features but weight has {weight.shape[1]}; they must agree")
    if targets.shape[0] != hidden.shape[0]:
        raise ValueError(f"targets has {targets.shape[0]} entries but hidden has {hidden.shape[0]} tokens; "
                         "there must be one target per token")
    if hidden.numel() == 0 or weight.numel() == 0:
        raise ValueError(f"empty input: tokens, d and vocab must all be >= 1, got hidden {tuple(hidden.shape)} "
                         f"and weight {tuple(weight.shape)}")
    if hidden.dtype not in DTYPES or weight.dtype != hidden.dtype:
        raise ValueError(f"hidden and weight must share one dtype, torch.float32 or torch.bfloat16; got "
                         f"{hidden.dtype} and {weight.dtype}")
    if targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"targets must be integer class indices (torch.int64 or torch.int32), got {targets.dtype}")
    want = device().type
    for name, t in (("hidden", hidden), ("weight", weight), ("targets", targets)):
        if t.device.type != want or t.device != hidden.device:
            raise ValueError(f"{name} is on {t.device}, hidden on {hidden.device}: all three must be on one {want} "
                             "device (utils.device.device())")
    vocab = weight.shape[0]
    counted = targets[targets != ignore_index]
    if counted.numel() and (int(counted.min()) < 0 or int(counted.max()) >= vocab):
        bad = counted[(counted < 0) | (counted >= vocab)][0].item()
        raise ValueError(f"targets must lie in [0, {vocab}) (the vocabulary) or equal ignore_index = {ignore_index}; "
                         f"found {bad}")


def _forward(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_size: int, ignore_index: int,
             want_hidden: bool, want_weight: bool):
    """Loop over chunks of tokens: the loss (fp32 scalar) and, if wanted, ``grad_hidden`` and ``grad_weight``."""
    tokens, vocab = hidden.shape[0], weight.shape[0]
    write_grad = want_hidden or want_weight
    n_valid = int((targets != ignore_index).sum())
    inv_n_valid = 1.0 / n_valid if n_valid else 0.0  # with no token counted the loss is 0/0 = nan, as in PyTorch
    loss_rows = torch.empty(tokens, dtype=torch.float32, device=hidden.device)
    grad_hidden = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if want_hidden else None
    grad_weight = torch.zeros_like(weight, dtype=torch.float32) if want_weight else None
    rows_max = min(chunk_size, tokens)
    buffer = torch.empty(rows_max, vocab, dtype=torch.float32, device=hidden.device)  # the only logits held
    block_size = min(MAX_BLOCK_SIZE, triton.next_power_of_2(vocab))
    for start in range(0, tokens, chunk_size):
        stop = min(start + chunk_size, tokens)
        h = hidden[start:stop]
        z = buffer[: stop - start]
        if hidden.dtype == torch.float32:
            torch.mm(h, weight.T, out=z)
        else:
            z.copy_(h @ weight.T)  # the matmul in bf16 (fp32 accumulation inside), the softmax in fp32
        cross_entropy_grad_kernel[(stop - start,)](z, targets[start:stop], loss_rows[start:stop], z.stride(0), vocab,
                                                   ignore_index, inv_n_valid, BLOCK_SIZE=block_size,
                                                   WRITE_GRAD=write_grad, num_warps=num_warps_for(block_size))
        if write_grad:
            g = z if hidden.dtype == torch.float32 else z.to(hidden.dtype)
            if want_hidden:
                torch.mm(g, weight, out=grad_hidden[start:stop])
            if want_weight:
                if hidden.dtype == torch.float32:
                    grad_weight.addmm_(g.T, h)
                else:
                    grad_weight += (g.T @ h).float()
    loss = loss_rows.sum() / n_valid
    if grad_weight is not None:
        grad_weight = grad_weight.to(weight.dtype)
    return loss, grad_hidden, grad_weight


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Gradients computed in forward, chunk by chunk; backward scales them by ``grad_output`` (the chain rule)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size, ignore_index, want_hidden, want_weight):
        loss, grad_hidden, grad_weight = _forward(hidden, weight, targets, chunk_size, ignore_index,
                                                  want_hidden, want_weight)
        ctx.save_for_backward(grad_hidden, grad_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        if not torch.equal(grad_output, torch.ones_like(grad_output)):  # loss.backward() passes 1: no copy then
            grad_hidden = None if grad_hidden is None else grad_hidden * grad_output.to(grad_hidden.dtype)
            grad_weight = None if grad_weight is None else grad_weight * grad_output.to(grad_weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                               chunk_size: int = 1024, ignore_index: int = -100) -> torch.Tensor:
    """``F.cross_entropy(hidden @ weight.T, targets, ignore_index=ignore_index)``, holding ``chunk_size x V`` logits.

    ``hidden``: ``(tokens, d)``, ``weight``: ``(vocab, d)``, both float32 or both bfloat16, on
    :func:`utils.device.device`; ``targets``: ``(tokens,)`` int64 or int32 in ``[0, vocab)`` or equal to
    ``ignore_index``. Returns the mean over the tokens not ignored as a 0-d float32 tensor (nan if every token is
    ignored, as in PyTorch), differentiable in ``hidden`` and ``weight``. The gradients are computed during this
    call (module docstring) and only when grad mode is on and the tensor requires grad.
    """
    _check(hidden, weight, targets, chunk_size, ignore_index)
    targets = targets.contiguous()
    grad_on = torch.is_grad_enabled()
    want_hidden, want_weight = grad_on and hidden.requires_grad, grad_on and weight.requires_grad
    if not (want_hidden or want_weight):
        return _forward(hidden, weight, targets, chunk_size, int(ignore_index), False, False)[0]
    return _FusedLinearCrossEntropy.apply(hidden, weight, targets, chunk_size, int(ignore_index),
                                          want_hidden, want_weight)


def peak_logits_nbytes(tokens: int, vocab: int, chunk_size: int, dtype: torch.dtype = torch.float32,
                       fused: bool = True) -> int:
    """Bytes of logits (and their gradient) held at once by the loss of ``tokens`` rows over ``vocab`` classes.

    Fused: ``min(chunk_size, tokens) * vocab * (4 + e)``, the fp32 buffer plus, for bf16 inputs (``e = 2``), the
    bf16 matmul result copied into it and the bf16 cast of its gradient (``e = 0`` for fp32). Unfused:
    ``4 * tokens * vocab``, the fp32 logits alone (Korthikanti et al., arXiv:2205.05198, section 4.3;
    :func:`utils.parallel.model.logits_memory.logits_bytes`), a lower bound: ``F.cross_entropy`` also keeps
    its log-softmax output, and backward makes a gradient of the same size.
    """
    for name, value in (("tokens", tokens), ("vocab", vocab), ("chunk_size", chunk_size)):
        check_positive_int(name, value)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype!r}")
    if not fused:
        return 4 * tokens * vocab
    extra = 0 if dtype == torch.float32 else torch.empty((), dtype=dtype).element_size()
    return min(chunk_size, tokens) * vocab * (4 + extra)


__all__ = ["cross_entropy_grad_kernel", "fused_linear_cross_entropy", "peak_logits_nbytes", "DTYPES",
           "MAX_BLOCK_SIZE"]
