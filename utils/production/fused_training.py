"""What fusing saves in training, counted in bytes: the output layer's logits, and AdamW's passes over memory.

**The logits wall.** The output layer turns ``N`` tokens of width ``d`` into
``N x V`` logits. Unfused, ``F.cross_entropy(hidden @ weight.T, y)`` makes the
logits and their log-softmax in forward (two ``N x V`` tensors; autograd keeps
the log-softmax), and in backward the gradient that reaches the log-softmax and
the gradient of the logits beside it: three ``N x V`` tensors at the peak, fp32
when the loss is computed in fp32 (:func:`loss_memory`). A fused linear + cross-entropy
(:mod:`utils.kernels.fused_linear_cross_entropy`) holds one ``chunk x V``
buffer at a time and keeps ``grad_hidden`` (``N x d``) and ``grad_weight``
(``V x d``) from forward to backward instead.

**AdamW's bytes.** One AdamW step is element-wise over every parameter, so on
the roofline it is bound by the bytes it moves. A fused kernel
(``torch.optim.AdamW(fused=True)``) reads the parameter, its gradient and both
moments and writes the parameter and both moments once: 7 fp32 accesses, 28
bytes per parameter. PyTorch's ``foreach`` implementation (its default on a
GPU) runs one multi-tensor kernel per operation, each a full pass over its
tensors (:data:`ADAMW_FOREACH_PASSES`, counted from ``_multi_tensor_adam`` in
``torch/optim/adam.py``, torch 2.13, decoupled weight decay, not capturable):
20 accesses, 80 bytes per parameter.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from utils.parallel.model.logits_memory import logits_bytes
from utils.validate import check_positive, check_positive_int


class Pass(NamedTuple):
    """One multi-tensor operation of an optimizer step: its name and the parameter-sized tensors it reads and writes."""

    op: str
    reads: int
    writes: int


ADAMW_FOREACH_PASSES = (
    Pass("_foreach_mul_(params, 1 - lr wd)", 1, 1),
    Pass("_foreach_lerp_(exp_avgs, grads, 1 - beta1)", 2, 1),
    Pass("_foreach_mul_(exp_avg_sqs, beta2)", 1, 1),
    Pass("_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)", 2, 1),
    Pass("denom = _foreach_sqrt(exp_avg_sqs)", 1, 1),
    Pass("_foreach_div_(denom, bias_correction2_sqrt)", 1, 1),
    Pass("_foreach_add_(denom, eps)", 1, 1),
    Pass("_foreach_addcdiv_(params, exp_avgs, denom, step_size)", 3, 1),
)
"""The parameter-sized passes of ``_multi_tensor_adam`` (torch 2.13) for AdamW with fp32 state; ``grads`` read
once by ``addcmul`` (its two operands are the same tensor)."""

ADAMW_FUSED_PASSES = (Pass("fused AdamW: read param, grad, exp_avg, exp_avg_sq; write param, exp_avg, exp_avg_sq",
                           4, 3),)
"""One kernel (``torch.optim.AdamW(fused=True)``, or an ``adamw`` Triton kernel): every tensor once."""

IMPLEMENTATIONS = {"foreach": ADAMW_FOREACH_PASSES, "fused": ADAMW_FUSED_PASSES}


def adamw_bytes_per_param(implementation: str = "fused", element_bytes: int = 4) -> int:
    """Bytes one AdamW step moves per parameter: the sum of reads and writes over its passes, times the element size."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {sorted(IMPLEMENTATIONS)}, got {implementation!r}")
    check_positive_int("element_bytes", element_bytes)
    return element_bytes * sum(p.reads + p.writes for p in IMPLEMENTATIONS[implementation])


def adamw_step_seconds(n_params: float, bandwidth_bytes_per_s: float, implementation: str = "fused") -> float:
    """The memory-bound time of one AdamW step over ``n_params`` fp32 parameters: bytes over bandwidth."""
    return (check_positive("n_params", n_params, finite=True) * adamw_bytes_per_param(implementation)
            / check_positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s, finite=True))


class LogitsMemory(NamedTuple):
    """Bytes of the output layer's loss at its peak (backward), unfused and fused (module docstring)."""

    unfused_saved: int       # the log-softmax autograd keeps for backward (N x V)
    unfused_grad_in: int     # the gradient reaching the log-softmax (N x V)
    unfused_grad_out: int    # the gradient of the logits it produces (N x V)
    fused_chunk: int         # one chunk of logits at a time (chunk x V)
    fused_saved: int         # grad_hidden and grad_weight, kept from forward to backward


def loss_memory(tokens: int, vocab: int, hidden: int, chunk: int = 1024, element_bytes: int = 4) -> LogitsMemory:
    """The bytes of :class:`LogitsMemory` for ``tokens`` tokens, a ``vocab``-word output layer of width ``hidden``.

    Each ``N x V`` tensor is part 2's :func:`utils.parallel.model.logits_memory.logits_bytes`; ``element_bytes``
    is the loss's precision (4: fp32, as the book's fused kernel and PyTorch's loss compute it).
    """
    for name, value in (("tokens", tokens), ("vocab", vocab), ("hidden", hidden), ("chunk", chunk),
                        ("element_bytes", element_bytes)):
        check_positive_int(name, value)
    full = logits_bytes(1, tokens, vocab, element_bytes=element_bytes)
    return LogitsMemory(full, full, full, logits_bytes(1, min(chunk, tokens), vocab, element_bytes=element_bytes),
                        (tokens * hidden + vocab * hidden) * element_bytes)


def plot_logits_memory(vocab: int = 128_256, tokens: int = 8192, chunk: int = 1024, hidden: int = 4096) -> Figure:
    """Bars of :func:`loss_memory`: what the unfused loss holds at its peak against the fused one, in GB."""
    m = loss_memory(tokens, vocab, hidden, chunk)
    fig, ax = plt.subplots(figsize=(7.5, 2.6))
    rows = [("unfused", [("log-softmax (saved)", m.unfused_saved, "#c44e52"),
                         ("its incoming gradient", m.unfused_grad_in, "#dd8452"),
                         ("the logits' gradient", m.unfused_grad_out, "#937860")]),
            ("fused", [("one chunk of logits", m.fused_chunk, "#55a868"),
                       ("grad_hidden + grad_weight (saved)", m.fused_saved, "#4c72b0")])]
    for y, (label, parts) in enumerate(rows):
        left = 0.0
        for name, nbytes, colour in parts:
            ax.barh(y, nbytes / 1e9, left=left, color=colour, edgecolor="white", label=name)
            left += nbytes / 1e9
        ax.text(left, y, f"  {left:.2f} GB", va="center", fontsize=9)
    ax.set(yticks=[0, 1], yticklabels=[r[0] for r in rows], xlabel="GB held by the loss at its peak",
           title=f"{tokens:,} tokens, vocabulary {vocab:,}, width {hidden:,}, chunks of {chunk:,} (fp32)")
    ax.invert_yaxis()
    ax.set_xlim(0, max(3 * m.unfused_saved, m.fused_chunk + m.fused_saved) / 1e9 * 1.25)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    return fig


class LargestTensors(TorchDispatchMode):
    """Records the bytes and dtype of every tensor an aten operator returns while active.

    ``with LargestTensors() as probe: ...`` then ``probe.largest_nbytes()``: the
    largest single tensor made, a lower bound on the peak that a CPU (which has
    no ``max_memory_allocated``) can measure. Under Triton's interpreter the
    kernels' storages show up too, as ``uint8`` copies: pass ``dtype`` to look
    at one kind only.
    """

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, torch.dtype]] = []

    def __torch_dispatch__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.seen += [(t.numel() * t.element_size(), t.dtype) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        return out

    def largest_nbytes(self, dtype: torch.dtype | None = None) -> int:
        """The largest tensor recorded (of ``dtype``, if given); ``ValueError`` if none was."""
        sizes = [n for n, dt in self.seen if dtype is None or dt == dtype]
        if not sizes:
            raise ValueError("no tensor was recorded" + (f" of dtype {dtype}" if dtype is not None else ""))
        return max(sizes)
