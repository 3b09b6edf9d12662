"""Dynamic loss scaling for fp16 training, and a small task whose fp16 gradients underflow without it.

fp16's smallest subnormal is ``2^-24`` (about 6e-8); smaller gradients round
to zero. Loss scaling (Micikevicius et al., "Mixed Precision Training",
arXiv:1710.03740, section 3.2) multiplies the loss by ``S`` before backward,
so every gradient is ``S`` times larger and stays representable, then divides
the gradients by ``S`` in fp32 before the optimizer step. *Dynamic* loss
scaling picks ``S`` as it goes: if any scaled gradient is inf or NaN the step
is skipped and ``S`` is multiplied by ``backoff_factor``; after
``growth_interval`` consecutive good steps ``S`` is multiplied by
``growth_factor``. :class:`DynamicLossScaler` follows ``torch.amp.GradScaler``
rule for rule, with its defaults (init 2^16, growth 2, backoff 0.5,
interval 2000; ``torch/amp/grad_scaler.py``), and the tests check it makes
the same decisions step by step.

Micikevicius et al. section 3.2 choose a *constant* scale (empirically, or
from gradient statistics) and suggest skipping the update when an overflow is
detected; the schedule that grows and backs off is NVIDIA's: Apex's
``DynamicLossScaler`` (``apex/fp16_utils/loss_scaler.py``: start at 2^32,
halve and skip on overflow, double after 1000 clean steps), then PyTorch's
``GradScaler``.

With model parallelism each rank holds a different shard of the parameters
and sees only its own gradients. :func:`found_inf_on_any_rank` all-reduces
the verdict with MAX, as Megatron-LM's mixed-precision optimizer does over the
model-parallel group (``_unscale_main_grads_and_check_for_nan`` in
``megatron/core/optimizer/optimizer.py``) and PyTorch's ``ShardedGradScaler``
over its process group, so that every rank skips the same steps and keeps the
same scale.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn

from utils.validate import check_positive, check_positive_int


class DynamicLossScaler:
    """``torch.amp.GradScaler``'s scale schedule, written out.

    Use per step: ``scaler.scale_loss(loss).backward()``; put the (scaled)
    gradients on the fp32 master parameters; ``found_inf =
    scaler.unscale_(params)``; step the optimizer only if ``not found_inf``;
    ``scaler.update(found_inf)``.
    """

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000) -> None:
        self.scale = check_positive("init_scale", init_scale, finite=True)
        self.growth_factor = check_positive("growth_factor", growth_factor, finite=True)
        if self.growth_factor <= 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
        self.backoff_factor = check_positive("backoff_factor", backoff_factor, finite=True)
        if self.backoff_factor >= 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
        self.growth_interval = check_positive_int("growth_interval", growth_interval)
        self.good_steps = 0
        """Consecutive steps without inf/NaN since the last change of scale (GradScaler's growth tracker)."""

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale``: backward of it gives gradients ``scale`` times larger."""
        return loss * self.scale

    def unscale_(self, params: Iterable[nn.Parameter]) -> bool:
        """Divide every ``p.grad`` by the scale in place (multiplying by ``1/scale`` in fp32, as GradScaler does).

        Returns ``found_inf``: True if any gradient holds inf or NaN, in which
        case the caller must skip the optimizer step.
        """
        inv_scale = torch.tensor(1.0 / self.scale, dtype=torch.float32)
        found_inf = False
        for p in params:
            if p.grad is None:
                continue
            if p.grad.dtype != torch.float32:
                raise ValueError(f"unscale_ expects fp32 (master) gradients, got {p.grad.dtype}; copy the 16-bit "
                                 "gradients to the fp32 master weights first (unscaling in fp16 could underflow)")
            found_inf |= not bool(torch.isfinite(p.grad).all())
            p.grad.mul_(inv_scale.to(p.grad.device))
        return found_inf

    def update(self, found_inf: bool) -> None:
        """Back off on inf/NaN, grow after ``growth_interval`` good steps in a row (GradScaler's ``update``).

        A grown scale that would be inf in fp32 (GradScaler keeps its scale as
        an fp32 tensor) is not taken (``_amp_update_scale_``).
        """
        if not isinstance(found_inf, bool):
            raise ValueError(f"found_inf must be True or False, got {found_inf!r}")
        if found_inf:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            grown = self.scale * self.growth_factor
            if grown <= torch.finfo(torch.float32).max:
                self.scale = grown
            self.good_steps = 0


def found_inf_on_any_rank(found_inf: bool, group: dist.ProcessGroup | None = None,
                          device: torch.device | str = "cpu") -> bool:
    """True on every rank of ``group`` if any rank found an inf or NaN: an all-reduce with MAX of a 0/1 flag.

    Call it between ``unscale_`` and the decision to step, with the group of
    ranks that hold different shards of one model (tensor and pipeline
    parallelism); data-parallel replicas already agree, since their gradients
    are averaged before the check. ``device`` is where the flag lives: the CPU
    for gloo, the rank's GPU for NCCL.
    """
    if not isinstance(found_inf, bool):
        raise ValueError(f"found_inf must be True or False, got {found_inf!r}")
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("found_inf_on_any_rank needs an initialised torch.distributed process group")
    flag = torch.tensor([1.0 if found_inf else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item() > 0)


# The lab's task: a deep, narrow tanh MLP (PyTorch's default init) regressing a teacher of the same shape.
# The loss is a mean over BATCH * OUT = 32768 elements, so each output's gradient is 2 * error / 32768,
# and it shrinks by about 2x per layer going backward: late in training, fp16 flushes the early layers'
# activation gradients to zero.
IN, HIDDEN, OUT, DEPTH, BATCH = 32, 64, 128, 8, 256


def make_mlp(seed: int = 0, depth: int = DEPTH, hidden: int = HIDDEN) -> nn.Sequential:
    """``depth`` tanh layers of width ``hidden`` and a linear head, PyTorch's default init, seeded."""
    check_positive_int("depth", depth)
    check_positive_int("hidden", hidden)
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    width = IN
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.Tanh()]
        width = hidden
    layers.append(nn.Linear(width, OUT))
    return nn.Sequential(*layers)


def make_task(seed: int = 0, batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``: ``batch`` Gaussian inputs and the outputs of a teacher MLP (seed ``seed + 1``) on them."""
    check_positive_int("batch", batch)
    teacher = make_mlp(seed + 1)
    g = torch.Generator().manual_seed(seed + 2)
    x = torch.randn(batch, IN, generator=g)
    with torch.no_grad():
        y = teacher(x)
    return x, y
