"""Capstone 1 with PyTorch's engines: the same model and steps with FSDP2, DTensor tensor parallelism and pipelining.

torchtitan's composition at toy scale (``torchtitan/models/llama3/infra/parallelize.py`` and
``pipeline.py``; Liang et al. 2024, "TorchTitan", arXiv:2410.06511, section 2). On a ``DeviceMesh`` of
shape ``(dp, pp, tp)``, whose rank order equals :class:`~utils.capstone.mesh.Mesh`'s with ``cp = 1``:

1. **pipeline**: every rank builds the whole model, then deletes what its stage does not hold (the
   blocks of other stages, the embedding unless first, the final norm and output unless last), so that
   parameter names stay those of the whole model; ``PipelineStage`` on the mesh's ``pp`` group and
   ``Schedule1F1B`` run the micro-batches;
2. **tensor parallelism with sequence parallelism**: ``parallelize_module`` with torchtitan's plan,
   ``SequenceParallel`` on the norms, ``PrepareModuleInput`` gathering the sequence into attention and
   the feed-forward, ``ColwiseParallel`` for ``wq``, ``wk``, ``wv``, ``w1``, ``w3`` and ``RowwiseParallel``
   with a sequence-sharded output for ``wo`` and ``w2``; the embedding row-wise (vocabulary-parallel,
   reduce-scattered to the sequence), the output column-wise with replicated logits;
3. **FSDP2**: ``fully_shard`` on each block, then on the stage, over the mesh's ``dp`` dimension.

Then ``torch.optim.Adam`` on the DTensor parameters. The blocks are part 3's own :class:`Attention`
(which counts its heads from the projections, so a rank's share works as is) with the norms as
modules (``SequenceParallel`` attaches to a module). :func:`engine_losses` must equal
:func:`utils.capstone.parallel_4d.train_losses` with ``cp = 1`` (tests/capstone).

Context parallelism is left out here: ``torch.distributed.tensor.experimental.context_parallel``
(torch 2.13) replaces SDPA's flash, memory-efficient and cuDNN attention operators, which are CUDA
kernels; on a CPU, SDPA runs ``_scaled_dot_product_flash_attention_for_cpu``, and inside
``context_parallel`` that fails with "Operator aten._scaled_dot_product_flash_attention_for_cpu.default
does not have a sharding strategy registered" (tried on 2 gloo ranks). On a CPU the book's ring
attention is the context parallelism; a GPU session can run PyTorch's.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from utils.attention.llama import Attention, TinyLlama, rms_norm
from utils.capstone.parallel_4d import LR, MICROBATCHES, check_layout, make_batch, make_model
from utils.dist import launch
from utils.parallel.model.pipeline_exec import stage_layers


class RMSNorm(nn.Module):
    """Part 3's ``rms_norm`` as a module, so that ``SequenceParallel`` can shard its input."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(weight.detach().clone()), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class FeedForward(nn.Module):
    """SwiGLU, ``w2(silu(w1 x) * w3 x)``, holding part 3's block's three linears."""

    def __init__(self, w1: nn.Linear, w2: nn.Linear, w3: nn.Linear) -> None:
        super().__init__()
        self.w1, self.w2, self.w3 = w1, w2, w3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class EngineBlock(nn.Module):
    """Part 3's block with its norms and SwiGLU as modules (torchtitan's names): the same function and weights."""

    def __init__(self, block) -> None:
        super().__init__()
        eps = block.config.eps
        self.attention_norm, self.attention = RMSNorm(block.attn_norm, eps), block.attn
        self.ffn_norm, self.feed_forward = RMSNorm(block.ffn_norm, eps), FeedForward(block.w1, block.w2, block.w3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class EngineLlama(nn.Module):
    """Part 3's :class:`TinyLlama` with torchtitan's module layout; layers in a ``ModuleDict`` keep their index."""

    def __init__(self, model: TinyLlama) -> None:
        super().__init__()
        self.tok_embeddings = model.embed
        self.layers = nn.ModuleDict({str(i): EngineBlock(b) for i, b in enumerate(model.blocks)})
        self.norm = RMSNorm(model.norm, model.config.eps)
        self.output = model.out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            x = self.tok_embeddings(x)
        for layer in self.layers.values():
            x = layer(x)
        if self.output is not None:
            x = self.output(self.norm(x))
        return x

    def keep_stage(self, stage: int, n_stages: int) -> None:
        """Delete what pipeline stage ``stage`` of ``n_stages`` does not hold (torchtitan's manual split)."""
        keep = {str(i) for i in stage_layers(len(self.layers), n_stages)[stage]}
        for name in [n for n in self.layers if n not in keep]:
            del self.layers[name]
        if stage > 0:
            self.tok_embeddings = None
        if stage < n_stages - 1:
            self.norm = self.output = None


def tensor_parallel_plan(model: EngineLlama) -> tuple[dict, dict]:
    """torchtitan's TP + SP plan: (the plan of the model's edges, the plan of every block)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
    )
    edges = {}
    if model.tok_embeddings is not None:
        edges["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.output is not None:
        edges["norm"] = SequenceParallel()
        edges["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    block = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    return edges, block


def _engine_rank(rank: int, world_size: int, dp: int, tp: int, pp: int, steps: int, seed: int,
                 dtype: torch.dtype) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from torch.distributed.tensor.parallel import parallelize_module

    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")  # a stage's output is a view; never edited
    mesh = init_device_mesh("cpu", (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))
    stage_index = mesh["pp"].get_local_rank()
    model = EngineLlama(make_model(seed, dtype))
    model.keep_stage(stage_index, pp)
    edges, block_plan = tensor_parallel_plan(model)
    if edges:
        parallelize_module(model, mesh["tp"], edges)
    for block in model.layers.values():
        parallelize_module(block, mesh["tp"], block_plan)
        fully_shard(block, mesh=mesh["dp"], reshard_after_forward=False)
    fully_shard(model, mesh=mesh["dp"], reshard_after_forward=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    stage = PipelineStage(model, stage_index, pp, torch.device("cpu"), group=mesh["pp"].get_group())
    schedule = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    first, last = stage_index == 0, stage_index == pp - 1
    losses = []
    for step in range(steps):
        inputs, targets = (t.chunk(dp)[mesh["dp"].get_local_rank()] for t in make_batch(step, seed))
        optimizer.zero_grad()
        micro_losses: list[torch.Tensor] = []
        if first and last:
            schedule.step(inputs, target=targets, losses=micro_losses)
        elif first:
            schedule.step(inputs)
        elif last:
            schedule.step(target=targets, losses=micro_losses)
        else:
            schedule.step()
        optimizer.step()
        # The mean over micro-batches is this data rank's loss; summed over the last stage's ranks of one tensor
        # rank (tensor ranks hold the same, replicated, logits) and divided by dp, the batch's.
        mine = torch.stack(micro_losses).mean().item() if last and mesh["tp"].get_local_rank() == 0 else 0.0
        loss = torch.tensor([mine], dtype=torch.float64)
        dist.all_reduce(loss)
        losses.append(loss.item() / dp)
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    return {"losses": losses, "local_numel": local, "layers": sorted(int(i) for i in model.layers)}


def engine_run(dp: int, tp: int, pp: int, steps: int = 4, seed: int = 0, dtype: torch.dtype = torch.float64,
               timeout: float = 300) -> list[dict]:
    """Train with FSDP2 x DTensor TP+SP x ``torch.distributed.pipelining`` 1F1B on ``dp * tp * pp`` gloo ranks.

    Each rank returns ``{"losses": [...], "local_numel": values it holds, "layers": its blocks' indices}``.
    """
    check_layout(dp, tp, pp, 1)
    return launch(_engine_rank, dp * tp * pp, dp, tp, pp, steps, seed, dtype, backend="gloo", timeout=timeout)


def engine_losses(dp: int, tp: int, pp: int, steps: int = 4, seed: int = 0,
                  dtype: torch.dtype = torch.float64) -> list[float]:
    """The loss of each step of :func:`engine_run` (the same on every rank)."""
    return engine_run(dp, tp, pp, steps, seed, dtype)[0]["losses"]
