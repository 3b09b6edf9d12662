"""LoRA: a frozen linear layer plus a trainable low-rank update ``W + (alpha / r) B A``.

Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models" (arXiv:2106.09685,
section 4.1): for a pretrained weight ``W_0`` of shape ``(d_out, d_in)``, LoRA
freezes ``W_0`` and learns ``Delta W = B A`` with ``B`` of shape ``(d_out, r)`` and
``A`` of shape ``(r, d_in)``, so the layer computes

    h = W_0 x + (alpha / r) B A x.

``A`` starts random and ``B`` at zero, so ``Delta W = 0`` and the adapted model
starts exactly equal to the pretrained one. The paper initialises ``A`` from a
Gaussian; its reference code (microsoft/LoRA, ``loralib``) and Hugging Face
PEFT use PyTorch's Kaiming-uniform default for ``nn.Linear``, as we do here.
The update is scaled by ``alpha / r``; the paper sets ``alpha`` to the first
``r`` it tries and does not tune it, saying this "helps to reduce the need to
retune hyperparameters when we vary r" (section 4.1). Kalajdzievski
(arXiv:2312.03732, rsLoRA) shows that ``alpha / r`` shrinks the gradients of
high-rank adapters so that they learn slowly, and recommends ``alpha / sqrt(r)``. After training, ``W_0 + (alpha / r) B A`` is
one ``d_out x d_in`` matrix again (:meth:`LoRALinear.merge`): no extra latency
at inference.

Trainable parameters per adapted matrix: ``r (d_in + d_out)`` instead of
``d_in d_out``; the paper's count for square ``d_model x d_model`` matrices is
``2 x L_LoRA x d_model x r`` over the ``L_LoRA`` adapted matrices.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from utils.parallel.memory import ADAM_MIXED_PRECISION_OPTIMIZER_BYTES, FP16_GRAD_BYTES, FP16_PARAM_BYTES
from utils.published import Published
from utils.validate import check_nonnegative, check_positive, check_positive_int

_LORA = "Hu et al., 'LoRA: Low-Rank Adaptation of Large Language Models', arXiv:2106.09685, abstract"
PUBLISHED = {
    "gpt3_trainable_reduction": Published(10_000, "x fewer trainable parameters than full fine-tuning of GPT-3 175B "
                                          "with Adam", _LORA),
    "gpt3_memory_reduction": Published(3, "x less GPU memory than full fine-tuning of GPT-3 175B with Adam", _LORA),
    "gpt3_full_vram_bytes": Published(1.2e12, "bytes of VRAM to fully fine-tune GPT-3 175B with Adam",
                                      _LORA.replace("abstract", "section 4.2")),
    "gpt3_lora_vram_bytes": Published(350e9, "bytes of VRAM to train LoRA on GPT-3 175B",
                                      _LORA.replace("abstract", "section 4.2")),
}
"""The LoRA paper's headline figures for GPT-3 175B."""

LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The names of a LLaMA decoder layer's linear layers in Hugging Face ``transformers``."""


class LoRALinear(nn.Module):
    """``base(x) + (alpha / rank) x A^T B^T``: a frozen ``nn.Linear`` with a trainable rank-``rank`` update.

    ``lora_a`` has shape ``(rank, in_features)`` (Kaiming-uniform), ``lora_b`` shape
    ``(out_features, rank)`` (zeros), so the layer starts equal to ``base``. ``base``'s
    weight and bias are frozen (``requires_grad=False``); only ``lora_a`` and ``lora_b`` train.
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float = 1.0) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise ValueError(f"base must be an nn.Linear, got {type(base).__name__}")
        check_positive_int("rank", rank)
        check_positive("alpha", alpha, finite=True)
        if rank > min(base.in_features, base.out_features):
            raise ValueError(f"rank must be at most min(in_features, out_features) = "
                             f"{min(base.in_features, base.out_features)}, got {rank}")
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.rank, self.alpha, self.scaling = rank, float(alpha), float(alpha) / rank
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, **factory))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, **factory))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))  # nn.Linear's default, as in loralib and PEFT

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scaling * ((x @ self.lora_a.T) @ self.lora_b.T)

    def delta_weight(self) -> torch.Tensor:
        """The update ``(alpha / rank) B A``, shape ``(out_features, in_features)``, of rank at most ``rank``."""
        return self.scaling * (self.lora_b @ self.lora_a)

    @torch.no_grad()
    def merge(self) -> nn.Linear:
        """A new ``nn.Linear`` with weight ``W + (alpha / rank) B A`` and ``base``'s bias: same outputs, no adapter."""
        merged = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None,
                           device=self.base.weight.device, dtype=self.base.weight.dtype)
        merged.weight.copy_(self.base.weight + self.delta_weight())
        if self.base.bias is not None:
            merged.bias.copy_(self.base.bias)
        return merged

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha:g}"


def apply_lora(model: nn.Module, rank: int, alpha: float = 1.0,
               targets: tuple[str, ...] = ("q_proj", "v_proj")) -> nn.Module:
    """Freeze ``model`` and replace, in place, each ``nn.Linear`` whose name ends with a target by a LoRALinear.

    The default targets are the query and value projections, the LoRA paper's
    choice for GPT-3 (section 7.1) and PEFT's default for LLaMA models. Returns
    ``model``; raises ``ValueError`` if no linear layer matched.
    """
    check_positive_int("rank", rank)
    if isinstance(targets, str) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(f"targets must be a non-empty tuple of module-name suffixes, got {targets!r}")
    for p in model.parameters():
        p.requires_grad_(False)
    matches = [name for name, module in model.named_modules()
               if isinstance(module, nn.Linear) and name.endswith(tuple(targets))]
    if not matches:
        raise ValueError(f"no nn.Linear in the model has a name ending with one of {tuple(targets)}")
    for name in matches:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(getattr(parent, child), rank, alpha))
    return model


def count_trainable(model: nn.Module) -> int:
    """The number of parameters of ``model`` with ``requires_grad=True``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def lora_param_count(shapes: list[tuple[int, int]], rank: int) -> int:
    """Trainable LoRA parameters of adapted matrices of ``(d_in, d_out)`` shapes: ``sum r (d_in + d_out)``."""
    check_positive_int("rank", rank)
    total = 0
    for d_in, d_out in shapes:
        total += rank * (check_positive_int("d_in", d_in) + check_positive_int("d_out", d_out))
    return total


def llama_linear_shapes(dim: int, n_layers: int, hidden: int, n_heads: int, n_kv_heads: int | None = None,
                        targets: tuple[str, ...] = ("q_proj", "v_proj")) -> list[tuple[int, int]]:
    """``(d_in, d_out)`` of every targeted linear layer of a LLaMA-style decoder (names of :data:`LLAMA_TARGETS`).

    ``q_proj``, ``o_proj``: ``dim x dim``; ``k_proj``, ``v_proj``: ``dim -> n_kv_heads * dim / n_heads``;
    ``gate_proj``, ``up_proj``: ``dim -> hidden``; ``down_proj``: ``hidden -> dim``.
    """
    for name, value in (("dim", dim), ("n_layers", n_layers), ("hidden", hidden), ("n_heads", n_heads)):
        check_positive_int(name, value)
    n_kv_heads = n_heads if n_kv_heads is None else check_positive_int("n_kv_heads", n_kv_heads)
    unknown = [t for t in targets if t not in LLAMA_TARGETS]
    if unknown or not targets:
        raise ValueError(f"targets must be a non-empty tuple drawn from {LLAMA_TARGETS}, got {targets!r}")
    kv = n_kv_heads * dim // n_heads
    shape = {"q_proj": (dim, dim), "k_proj": (dim, kv), "v_proj": (dim, kv), "o_proj": (dim, dim),
             "gate_proj": (dim, hidden), "up_proj": (dim, hidden), "down_proj": (hidden, dim)}
    return [shape[t] for _ in range(n_layers) for t in targets]


def finetune_state_bytes(n_frozen: float, n_trainable: float,
                         frozen_bytes_per_param: float = FP16_PARAM_BYTES) -> float:
    """Bytes of model state on one GPU to fine-tune with ``n_frozen`` frozen and ``n_trainable`` trained parameters.

    A trained parameter costs what mixed-precision Adam costs (ZeRO, arXiv:1910.02054,
    section 3.1): 2 (fp16 weight) + 2 (fp16 gradient) + 12 (fp32 master weight,
    momentum, variance) = 16 bytes. A frozen one keeps only its weight: 2 bytes in
    fp16 (0.5 for a 4-bit base as in QLoRA). Full fine-tuning of N parameters is
    ``(0, N)``; LoRA is ``(N, adapter parameters)``. Activations are left out.
    """
    check_nonnegative("n_frozen", n_frozen)
    check_nonnegative("n_trainable", n_trainable)
    check_nonnegative("frozen_bytes_per_param", frozen_bytes_per_param)
    trained = FP16_PARAM_BYTES + FP16_GRAD_BYTES + ADAM_MIXED_PRECISION_OPTIMIZER_BYTES
    return frozen_bytes_per_param * float(n_frozen) + trained * float(n_trainable)
