"""A quantised tiny LLaMA: weight-only int8/int4 linear layers, and simulated W8A8 (int8 or FP8).

**Weight-only** (:class:`QuantLinear`, :func:`quantize_model`). Every ``nn.Linear`` of the blocks keeps its
weight as :func:`utils.serving.quantisation.quant.quantize`'s ``(q, scales, zeros)``, round to nearest with one scale and
zero point per ``group_size`` input columns, and computes ``y = x @ dequantize(q, scales, zeros).T`` in the
activations' dtype. Here the dequantisation runs in PyTorch and builds the whole weight every call: it shows
the *numbers* a quantised model computes, not its speed. On a GPU the same layout goes to a fused kernel that
dequantises in registers, :func:`utils.kernels.quant_matmul.quant_matmul`, so HBM carries only the packed
weights; that is where the saving in bytes per token comes from.

**W8A8** (:class:`FakeQuantLinear`, :func:`fake_quantize_model`). Weights *and* activations in 8 bits, so the
matmul itself can run on int8 or FP8 Tensor Cores (SmoothQuant, Xiao et al. 2022, arXiv:2211.10438; FP8
formats, Micikevicius et al. 2022, arXiv:2209.05433). It is *simulated* here ("fake quantisation"): each
operand is rounded to the 8-bit grid and back, then multiplied in float, which gives the same numbers as an
exact 8-bit product accumulated in fp32, up to the order of the sums.

- ``"int8"``: symmetric, ``s = max|.| / 127``, one scale per weight row (output channel) and one per
  activation row (token, computed on the fly);
- ``"fp8_e4m3"``: ``float8_e4m3fn`` with one scale per tensor, ``s = max|.| / 448``, for the weight and
  (dynamically, per call) for the activations.

Embedding tables stay in full precision (a step reads only the rows of its tokens), and so, by default, does
the output head: GPTQ's and AWQ's released models keep it in 16 bits too.
"""

from __future__ import annotations

import copy

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from utils.attention.llama import TinyLlama
from utils.serving.runtime.paged_forward import KVBlocks, Segment, forward_segments
from utils.serving.quantisation.quant import FP8_E4M3_MAX, check_bits_group, dequantize, quantize

__all__ = ["W8A8_FORMATS", "FakeQuantLinear", "QuantLinear", "fake_quant", "fake_quantize_model",
           "linear_weight_nbytes", "paged_logits", "quality", "quantize_model"]

W8A8_FORMATS = ("int8", "fp8_e4m3")


class QuantLinear(nn.Module):
    """A bias-free linear layer whose weight is stored as int8 or packed int4 with group-wise scales."""

    def __init__(self, linear: nn.Linear, bits: int, group_size: int | None = None) -> None:
        super().__init__()
        if not isinstance(linear, nn.Linear) or linear.bias is not None:
            raise ValueError("QuantLinear quantises a bias-free nn.Linear (the LLaMA layers have none)")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.group_size = self.in_features if group_size is None else group_size
        check_bits_group(bits, self.group_size, self.in_features)
        self.bits = bits
        q, scales, zeros = quantize(linear.weight.detach(), bits, self.group_size)
        self.register_buffer("q", q)
        self.register_buffer("scales", scales)
        self.register_buffer("zeros", zeros)

    def dequantized_weight(self) -> torch.Tensor:
        """``(out_features, in_features)``: the weight the layer computes with."""
        return dequantize(self.q, self.scales, self.zeros, self.group_size, self.bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized_weight().to(x.dtype))

    @property
    def nbytes(self) -> int:
        """Bytes stored: packed levels, scales and zero points."""
        return self.q.nbytes + self.scales.nbytes + self.zeros.nbytes

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bits={self.bits}, group_size={self.group_size}"


def fake_quant(x: torch.Tensor, fmt: str, dim: int | None) -> torch.Tensor:
    """Round ``x`` to the 8-bit grid of ``fmt`` and back, one scale per slice along ``dim`` (``None``: per tensor).

    ``"int8"``: ``s = max|x| / 127``, ``x_hat = clamp(round(x / s), -127, 127) s``; ``"fp8_e4m3"``:
    ``s = max|x| / 448``, ``x_hat = e4m3(x / s) s``. An all-zero slice gets ``s = 1``.
    """
    if fmt not in W8A8_FORMATS:
        raise ValueError(f"fmt must be one of {W8A8_FORMATS}, got {fmt!r}")
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    amax = xf.abs().amax() if dim is None else xf.abs().amax(dim=dim, keepdim=True)
    top = 127.0 if fmt == "int8" else FP8_E4M3_MAX
    scale = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    if fmt == "int8":
        grid = torch.round(xf / scale).clamp(-127, 127)
    else:
        grid = (xf / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).to(xf.dtype)
    return (grid * scale).to(x.dtype)


class FakeQuantLinear(nn.Module):
    """W8A8 simulated: the weight rounded once to ``fmt``, each call's activations rounded on the fly."""

    def __init__(self, linear: nn.Linear, fmt: str) -> None:
        super().__init__()
        if not isinstance(linear, nn.Linear) or linear.bias is not None:
            raise ValueError("FakeQuantLinear quantises a bias-free nn.Linear (the LLaMA layers have none)")
        if fmt not in W8A8_FORMATS:
            raise ValueError(f"fmt must be one of {W8A8_FORMATS}, got {fmt!r}")
        self.fmt = fmt
        per_row = 1 if fmt == "int8" else None  # int8: a scale per output channel; FP8: one per tensor
        self.register_buffer("weight", fake_quant(linear.weight.detach(), fmt, per_row))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        per_token = -1 if self.fmt == "int8" else None
        return F.linear(fake_quant(x, self.fmt, per_token), self.weight.to(x.dtype))

    @property
    def nbytes(self) -> int:
        """Bytes a real W8A8 layer stores: one byte per weight plus fp32 scales (per row for int8, one for FP8)."""
        return self.weight.numel() + 4 * (self.weight.shape[0] if self.fmt == "int8" else 1)


def _replace_linears(model: TinyLlama, make, include_head: bool) -> TinyLlama:
    if not isinstance(model, TinyLlama):
        raise ValueError(f"model must be a utils.attention.llama.TinyLlama, got {type(model).__name__}")
    out = copy.deepcopy(model).eval()
    for block in out.blocks:
        for parent in (block.attn, block):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, make(child))
    if include_head:
        out.out = make(out.out)
    return out


def quantize_model(model: TinyLlama, bits: int, group_size: int | None = None, include_head: bool = False
                   ) -> TinyLlama:
    """A copy of ``model`` whose blocks' linear layers are weight-only ``bits``-bit :class:`QuantLinear`.

    ``group_size=None`` gives one scale per output channel (a group as wide as the row). The embedding stays,
    and the output head too unless ``include_head``. ``model`` itself is left unchanged.
    """
    return _replace_linears(model, lambda lin: QuantLinear(lin, bits, group_size), include_head)


def fake_quantize_model(model: TinyLlama, fmt: str, include_head: bool = False) -> TinyLlama:
    """A copy of ``model`` with simulated W8A8 linear layers (:class:`FakeQuantLinear`) in ``fmt``."""
    if fmt not in W8A8_FORMATS:
        raise ValueError(f"fmt must be one of {W8A8_FORMATS}, got {fmt!r}")
    return _replace_linears(model, lambda lin: FakeQuantLinear(lin, fmt), include_head)


def linear_weight_nbytes(model: TinyLlama) -> int:
    """Bytes of the weights of every linear layer (blocks and output head): what a decode step reads."""
    if not isinstance(model, TinyLlama):
        raise ValueError(f"model must be a utils.attention.llama.TinyLlama, got {type(model).__name__}")
    total = 0
    for module in model.modules():
        if isinstance(module, (QuantLinear, FakeQuantLinear)):
            total += module.nbytes
        elif isinstance(module, nn.Linear):
            total += module.weight.nbytes
    return total


@torch.no_grad()
def paged_logits(model: TinyLlama, tokens: torch.Tensor, kv_format: str | None = None, block_size: int = 16
                 ) -> torch.Tensor:
    """Logits at every position of ``tokens`` (``(n, seq_len)``), decoded one token per step through a paged cache.

    Every position's keys and values are read back from the cache, stored in ``kv_format``
    (:class:`utils.serving.runtime.paged_forward.KVBlocks`), so a quantised cache's error reaches every prediction:
    teacher forcing through the serving path. Returns ``(n, seq_len, vocab)``.
    """
    if tokens.dim() != 2 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must be (n_sequences, seq_len >= 1), got shape {tuple(tokens.shape)}")
    n, seq_len = tokens.shape
    per_seq = math.ceil(seq_len / block_size)
    kv = KVBlocks(model, n * per_seq, block_size, kv_format=kv_format)
    tables = [tuple(range(i * per_seq, (i + 1) * per_seq)) for i in range(n)]
    rows = tokens.tolist()
    steps = [forward_segments(model, kv, [Segment((rows[i][t],), t, tables[i]) for i in range(n)])
             for t in range(seq_len)]
    return torch.stack(steps, dim=1)


@torch.no_grad()
def quality(logits: torch.Tensor, reference: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """How far ``logits`` are from ``reference`` logits (same shape ``(..., vocab)``), and how well they predict.

    ``loss`` (nats) and ``accuracy`` against ``targets``; ``kl``: mean ``KL(reference || logits)`` of the
    next-token distributions, in nats; ``agreement``: the share of positions whose greedy token is the
    reference's.
    """
    if logits.shape != reference.shape or logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and reference {tuple(reference.shape)} must match, and "
                         f"targets {tuple(targets.shape)} must be their shape without the vocabulary axis")
    logp, ref_logp = logits.float().log_softmax(-1), reference.float().log_softmax(-1)
    vocab = logits.shape[-1]
    return {"loss": float(F.nll_loss(logp.reshape(-1, vocab), targets.reshape(-1))),
            "accuracy": float((logits.argmax(-1) == targets).float().mean()),
            "kl": float((ref_logp.exp() * (ref_logp - logp)).sum(-1).mean()),
            "agreement": float((logits.argmax(-1) == reference.argmax(-1)).float().mean())}
