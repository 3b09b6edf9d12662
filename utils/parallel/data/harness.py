"""A tiny training run, on one process or on N ranks with any data-parallel strategy: the labs' yardstick.

Data parallelism must train the same model as one process on the whole batch
(:mod:`utils.parallel.data.data_parallel` says why). This harness makes that
checkable: a seeded MLP (:func:`make_mlp`), a seeded regression task
(:func:`make_regression_data`), one process on the full batch
(:func:`train_single_process`), and the same run on N ranks
(:func:`train_data_parallel`) with the reference implementations of
:mod:`utils.parallel.data.data_parallel` or with PyTorch's
``DistributedDataParallel`` or FSDP2's ``fully_shard`` (Zhao et al., "PyTorch
FSDP: Experiences on Scaling Fully Sharded Data Parallel", arXiv:2304.11277).
Each rank trains on its :func:`batch_shard` of every global batch.

:func:`train_data_parallel` is a worker for :func:`utils.dist.launch` or
:func:`utils.dist.torchrun_main`. Run on GPUs:
``torchrun --nproc-per-node=4 -m benchmarks.ddp_from_scratch`` and
``torchrun --nproc-per-node=4 -m benchmarks.zero_and_fsdp``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from utils.dist_policy import worker_device
from utils.parallel.data.data_parallel import (
    BucketedDDP,
    ZeroOneOptimizer,
    all_reduce_gradients,
    broadcast_parameters,
    optimizer_state_nbytes,
    tensor_nbytes,
)
from utils.parallel.data.zero import ZeroTwoOptimizer
from utils.validate import check_positive, check_positive_int

STRATEGIES = ("naive", "bucketed", "torch_ddp", "zero1", "zero2", "fsdp2")
"""The ways :func:`train_data_parallel` can synchronise N ranks."""


@dataclass(frozen=True)
class TrainConfig:
    """A tiny regression run: an MLP of ``n_layers`` Linear layers, ``n_steps`` steps of ``batch_size`` samples.

    ``batch_size`` is the *global* batch; each of N ranks takes ``batch_size / N`` of it.
    ``optimizer`` is ``"sgd"`` (plain SGD) or ``"adam"``.
    """

    d_in: int = 16
    d_hidden: int = 32
    d_out: int = 4
    n_layers: int = 4
    batch_size: int = 32
    n_steps: int = 5
    lr: float = 0.2
    optimizer: str = "sgd"
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("d_in", "d_hidden", "d_out", "n_layers", "batch_size", "n_steps"):
            check_positive_int(name, getattr(self, name))
        check_positive("lr", self.lr, finite=True)
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {self.optimizer!r}")


def make_mlp(config: TrainConfig = TrainConfig()) -> nn.Sequential:
    """The seeded MLP of ``config``: Linear, Tanh, ..., Linear; the same weights on every rank and every run.

    The global random state is left untouched (the seed is applied inside ``torch.random.fork_rng``).
    """
    dims = [config.d_in] + [config.d_hidden] * (config.n_layers - 1) + [config.d_out]
    layers: list[nn.Module] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        for i, (fan_in, fan_out) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(nn.Linear(fan_in, fan_out))
            if i < config.n_layers - 1:
                layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def make_regression_data(config: TrainConfig = TrainConfig()) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs ``x`` of shape ``(n_steps * batch_size, d_in)`` and targets ``y = sin(x W) + 0.1 noise``, seeded.

    Step ``k`` trains on rows ``[k * batch_size, (k + 1) * batch_size)``.
    """
    gen = torch.Generator().manual_seed(config.seed + 1)
    n = config.n_steps * config.batch_size
    w = torch.randn(config.d_in, config.d_out, generator=gen) / math.sqrt(config.d_in)
    x = torch.randn(n, config.d_in, generator=gen)
    y = torch.sin(x @ w) + 0.1 * torch.randn(n, config.d_out, generator=gen)
    return x, y


def batch_shard(batch: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rows ``[rank * B / N, (rank + 1) * B / N)`` of a batch of ``B`` rows: rank ``rank``'s equal share."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    if batch.shape[0] % world_size:
        raise ValueError(f"a batch of {batch.shape[0]} rows does not split evenly over {world_size} ranks; "
                         "use a batch size divisible by the world size (unequal shards would weight samples unequally)")
    per_rank = batch.shape[0] // world_size
    return batch[rank * per_rank:(rank + 1) * per_rank]


def _optimizer(params: Iterable[torch.Tensor], config: TrainConfig) -> torch.optim.Optimizer:
    cls = torch.optim.SGD if config.optimizer == "sgd" else torch.optim.Adam
    return cls(params, lr=config.lr)


def train_single_process(config: TrainConfig = TrainConfig()) -> dict[str, Any]:
    """One process trains on the whole batch: the result data parallelism must reproduce.

    Returns ``losses`` (one float per step) and ``weights`` (the final state dict).
    """
    model = make_mlp(config)
    x, y = make_regression_data(config)
    opt = _optimizer(model.parameters(), config)
    losses = []
    for step in range(config.n_steps):
        rows = slice(step * config.batch_size, (step + 1) * config.batch_size)
        loss = F.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "weights": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def train_data_parallel(rank: int, world_size: int, strategy: str, config: TrainConfig = TrainConfig(),
                        bucket_cap_bytes: int = 2048) -> dict[str, Any]:
    """Train ``config``'s model on ``world_size`` ranks with ``strategy`` (one of :data:`STRATEGIES`).

    A worker for :func:`utils.dist.launch` or :func:`utils.dist.torchrun_main`.
    Each rank trains on its :func:`batch_shard` of every global batch. Returns
    ``losses`` (the global-batch loss per step, averaged over ranks),
    ``weights`` (the full final state dict), ``step_seconds`` (wall time of each
    step on this rank, between barriers), ``n_all_reduce_calls`` (gradient
    all-reduces per step, or None where not counted), and the bytes this rank
    holds after the last backward: ``param_nbytes``, ``grad_nbytes``,
    ``optimizer_state_nbytes`` (``"zero2"`` also ``full_grad_peak_nbytes``, the most
    unsharded gradient alive at once). ``"zero1"``, ``"zero2"`` and ``"fsdp2"`` use Adam
    whatever ``config.optimizer`` says (their point is Adam's state).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    device = worker_device()
    model = make_mlp(config).to(device)
    x, y = (t.to(device) for t in make_regression_data(config))
    calls: int | None = None
    if strategy == "naive":
        broadcast_parameters(model)
        net, opt = model, _optimizer(model.parameters(), config)
    elif strategy == "bucketed":
        net = BucketedDDP(model, bucket_cap_bytes)
        opt = _optimizer(model.parameters(), config)
    elif strategy == "torch_ddp":
        net = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_bytes / 2**20)
        opt = _optimizer(model.parameters(), config)
    elif strategy == "zero1":
        broadcast_parameters(model)
        net, opt = model, ZeroOneOptimizer(model.parameters(), torch.optim.Adam, lr=config.lr)
    elif strategy == "zero2":
        broadcast_parameters(model)
        net, opt = model, ZeroTwoOptimizer(model.parameters(), torch.optim.Adam, lr=config.lr)
    else:  # fsdp2
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world_size,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        net = fully_shard(model, mesh=mesh)
        opt = torch.optim.Adam(model.parameters(), lr=config.lr)

    losses, step_seconds = [], []
    for step in range(config.n_steps):
        rows = slice(step * config.batch_size, (step + 1) * config.batch_size)
        xs, ys = batch_shard(x[rows], rank, world_size), batch_shard(y[rows], rank, world_size)
        dist.barrier()
        start = time.perf_counter()
        loss = F.mse_loss(net(xs), ys)
        loss.backward()
        if strategy == "naive":
            calls = all_reduce_gradients(model)
        elif strategy == "bucketed":
            calls = net.finish_gradient_synchronization()
        grad_nbytes = opt.gradient_nbytes() if strategy == "zero2" else tensor_nbytes(p.grad for p in model.parameters())
        opt.step()
        opt.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize()
        step_seconds.append(time.perf_counter() - start)
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        losses.append(global_loss.item() / world_size)

    weights = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
               for k, v in model.state_dict().items()}
    out = {"losses": losses, "weights": weights, "step_seconds": step_seconds, "n_all_reduce_calls": calls,
           "param_nbytes": tensor_nbytes(model.parameters()), "grad_nbytes": grad_nbytes,
           "optimizer_state_nbytes": optimizer_state_nbytes(opt.optimizer if strategy == "zero2" else opt)}
    if strategy == "zero2":
        out["full_grad_peak_nbytes"] = opt.full_grad_peak_nbytes
        opt.remove_hooks()
    return out
