"""A private stand-in for ``utils.rl.lora`` (written by another helper, same API); delete it at the merge.

``LoRALinear(base, rank, alpha)`` computes ``base(x) + (alpha / rank) x A^T B^T`` with ``A`` (rank, in)
random and ``B`` (out, rank) zero (Hu et al. 2021, arXiv:2106.09685, section 4.1).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float = 1.0):
        super().__init__()
        self.base, self.rank, self.alpha = base, rank, alpha
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (self.alpha / self.rank) * (x @ self.lora_a.T) @ self.lora_b.T

    def merge(self) -> nn.Linear:
        merged = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None)
        with torch.no_grad():
            merged.weight.copy_(self.base.weight + (self.alpha / self.rank) * self.lora_b @ self.lora_a)
            if self.base.bias is not None:
                merged.bias.copy_(self.base.bias)
        return merged


def apply_lora(model: nn.Module, rank: int, alpha: float = 1.0, targets=("q", "v")) -> nn.Module:
    for p in model.parameters():
        p.requires_grad_(False)
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and child_name in targets:
                setattr(module, child_name, LoRALinear(child, rank, alpha))
    return model


def count_trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
