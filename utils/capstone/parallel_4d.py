"""Capstone 1: train part 3's tiny LLaMA over a DP x TP x PP x CP mesh built from the book's own parts.

Every rank of a :class:`~utils.capstone.mesh.Mesh` holds one piece of one copy of the model and one
piece of the batch:

- **pipeline** (``pp``): consecutive layers, cut by :func:`~utils.parallel.model.pipeline_exec.stage_layers`;
  the first stage also holds the embedding, the last the final norm, the output projection and the loss.
  Micro-batches run the 1F1B schedule of :func:`~utils.parallel.model.pipeline_exec.run_schedule` on the
  pipeline group (Narayanan et al. 2021, arXiv:2104.04473, section 2.2);
- **tensor** (``tp``): each block is a :class:`~utils.capstone.tensor_parallel_llama.TensorParallelBlock`,
  Megatron's split with sequence parallelism; between blocks (and between stages) a rank holds
  ``1/tp`` of its tokens;
- **context** (``cp``): each sequence is cut into ``2 cp`` chunks, and context rank ``c`` holds chunks
  ``c`` and ``2 cp - 1 - c`` (the zig-zag layout that balances causal work, Llama 3 section 3.3.2);
  attention is ring attention over the context group
  (:func:`~utils.parallel.frontier.context_parallel.ring_attention`);
- **data** (``dp``): each data rank takes ``1/dp`` of the sequences; ZeRO stage 2
  (:class:`~utils.parallel.data.zero.ZeroTwoOptimizer`) shards the gradients and Adam's state over the
  data x context group, since every rank of that group holds the same parameters for other tokens.

The objective is the mean cross-entropy over every token of the batch. A rank's share of it
(:func:`loss_share`) is its tokens' summed cross-entropy divided by the tokens of its micro-batch's
context share: summed over
the tensor group (the sequence-parallel reduce-scatters' backward all-gathers do that for the sharded
weights) it is the mean over the context share; :func:`run_schedule` divides by the micro-batch count; ZeRO's
average over data x context (equal token counts) makes it the mean over the batch. The parameters
every tensor rank holds whole (norms, embedding, output projection) see only their rank's tokens, so
their reduced gradient slices are summed over the tensor group before the step (:func:`finish_gradients`).

:func:`train_losses` launches ``dp * tp * pp * cp`` gloo ranks and returns the loss of each step;
:func:`reference_losses` is one process training the same model on the same batches. In fp64 the two
agree to about 1e-13 (tests/capstone); only the order of floating-point sums differs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from utils.attention.llama import LlamaConfig, TinyLlama, rms_norm
from utils.capstone.mesh import Mesh, new_groups
from utils.capstone.tensor_parallel_llama import TensorParallelBlock
from utils.capstone.traffic import Call, CommLedger, Row, compare, group_labels, predicted_wire_bytes
from utils.dist import launch
from utils.parallel.data.zero import ZeroTwoOptimizer
from utils.parallel.frontier.context_parallel import positions, shard_sequence
from utils.parallel.model.pipeline_exec import run_schedule, stage_layers
from utils.validate import check_positive_int

CONFIG = LlamaConfig(vocab=64, dim=32, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=64)
"""The model: part 3's LLaMA with grouped-query attention (2 query heads per key/value head)."""
SEQ_LEN = 16
BATCH = 8
MICROBATCHES = 2
LR = 1e-2
CP_LAYOUT = "zigzag"
GROUPS = (("tp",), ("cp",), ("pp",), ("cp", "dp"))
TP_SHARD_DIM = {"wq": 0, "wk": 0, "wv": 0, "wo": 1, "w1": 0, "w3": 0, "w2": 1}
"""The dim along which each weight of a TensorParallelBlock is a tensor rank's shard (others are whole)."""
_BLOCK_NAMES = {"wq": "attn.wq.weight", "wk": "attn.wk.weight", "wv": "attn.wv.weight", "wo": "attn.wo.weight",
                "w1": "w1.weight", "w3": "w3.weight", "w2": "w2.weight", "attn_norm": "attn_norm",
                "ffn_norm": "ffn_norm"}


def check_layout(dp: int, tp: int, pp: int, cp: int, config: LlamaConfig = CONFIG, seq_len: int = SEQ_LEN,
                 batch: int = BATCH, microbatches: int = MICROBATCHES) -> Mesh:
    """The mesh of a layout the model and batch can be cut into; ``ValueError`` saying why otherwise."""
    for name, n in (("dp", dp), ("tp", tp), ("pp", pp), ("cp", cp), ("seq_len", seq_len), ("batch", batch),
                    ("microbatches", microbatches)):
        check_positive_int(name, n)
    for what, n in (("n_heads", config.n_heads), ("n_kv_heads", config.n_kv_heads), ("the SwiGLU hidden size",
                                                                                      config.hidden)):
        if n % tp:
            raise ValueError(f"tp={tp} must divide {what} ({n}): each tensor rank holds whole heads and units")
    if pp > config.n_layers:
        raise ValueError(f"pp={pp} pipeline stages need at least {pp} layers; the model has {config.n_layers}")
    if seq_len % (2 * cp):
        raise ValueError(f"cp={cp} cuts each sequence into 2*cp = {2 * cp} zig-zag chunks; "
                         f"seq_len={seq_len} is not divisible by {2 * cp}")
    if (seq_len // cp) % tp:
        raise ValueError(f"sequence parallelism splits each context share of {seq_len // cp} tokens over "
                         f"tp={tp} ranks; it does not divide")
    if batch % (dp * microbatches):
        raise ValueError(f"batch={batch} must split into dp={dp} x microbatches={microbatches} equal parts")
    return Mesh(dp=dp, tp=tp, pp=pp, cp=cp)


def make_model(seed: int = 0, dtype: torch.dtype = torch.float64, config: LlamaConfig = CONFIG) -> TinyLlama:
    """The model every rank builds (then keeps its piece of); norm weights are drawn, not ones, so that a
    wrong norm gradient shows in the losses."""
    torch.manual_seed(seed)
    model = TinyLlama(config).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def make_batch(step: int, seed: int = 0, config: LlamaConfig = CONFIG, seq_len: int = SEQ_LEN,
               batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s inputs and next-token targets, ``(batch, seq_len)`` each: arithmetic sequences
    ``t_{i+1} = t_i + d (mod vocab)`` with a random start and a stride ``d`` of 1 to 3, so a model can learn them."""
    g = torch.Generator().manual_seed(1000 * seed + step)
    start = torch.randint(0, config.vocab, (batch, 1), generator=g)
    stride = torch.randint(1, 4, (batch, 1), generator=g)
    tokens = (start + stride * torch.arange(seq_len + 1)) % config.vocab
    return tokens[:, :-1], tokens[:, 1:]


def reference_losses(steps: int = 4, seed: int = 0, dtype: torch.dtype = torch.float64,
                     lr: float = LR) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process: the loss of each step and the final parameters (by name)."""
    model = make_model(seed, dtype)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in range(check_positive_int("steps", steps)):
        inputs, targets = make_batch(step, seed)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


class Stage(nn.Module):
    """One rank's piece of the model: its pipeline stage's layers, tensor-parallel, on its tokens.

    ``forward`` maps the stage's input (token ids on the first stage, else the previous stage's
    activations) for this rank's ``seq_len / (cp * tp)`` tokens to the next stage's input, or to the logits
    of those tokens on the last stage.
    """

    def __init__(self, model: TinyLlama, mesh: Mesh, rank: int, groups: dict, seq_len: int) -> None:
        super().__init__()
        at, c = mesh.coords(rank), model.config
        self.first, self.last, self.eps = at["pp"] == 0, at["pp"] == mesh.pp - 1, c.eps
        self.layers = stage_layers(c.n_layers, mesh.pp)[at["pp"]]
        self.blocks = nn.ModuleList(TensorParallelBlock(model.blocks[i], groups[("tp",)],
                                                        cp_group=groups[("cp",)] if mesh.cp > 1 else None,
                                                        cp_layout=CP_LAYOUT)
                                    for i in self.layers)
        self.register_buffer("positions", positions(seq_len, at["cp"], mesh.cp, CP_LAYOUT), persistent=False)
        self.embed = nn.Parameter(model.embed.weight.detach().clone()) if self.first else None
        self.norm = nn.Parameter(model.norm.detach().clone()) if self.last else None
        self.out = nn.Parameter(model.out.weight.detach().clone()) if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = F.embedding(x, self.embed)
        for block in self.blocks:
            x = block(x, self.positions)
        if self.last:
            x = F.linear(rms_norm(x, self.norm, self.eps), self.out)
        return x

    def tp_replicated_parameters(self) -> list[nn.Parameter]:
        """Parameters every tensor rank holds whole, each seeing only its rank's tokens."""
        extra = [p for p in (self.embed, self.norm, self.out) if p is not None]
        return extra + [p for b in self.blocks for p in b.replicated_parameters()]

    def named_full_parameters(self) -> dict[str, tuple[torch.Tensor, int | None]]:
        """This rank's parameters under the one-process model's names, each with its tensor-shard dim (or None)."""
        out: dict[str, tuple[torch.Tensor, int | None]] = {}
        if self.first:
            out["embed.weight"] = (self.embed.detach(), None)
        for i, block in zip(self.layers, self.blocks):
            for name, p in block.named_parameters():
                out[f"blocks.{i}.{_BLOCK_NAMES[name]}"] = (p.detach(), TP_SHARD_DIM.get(name))
        if self.last:
            out["norm"], out["out.weight"] = (self.norm.detach(), None), (self.out.detach(), None)
        return out


def local_tokens(tokens: torch.Tensor, mesh: Mesh, rank: int) -> torch.Tensor:
    """This rank's tokens of a ``(batch, seq)`` batch: its data rank's sequences, its context share (zig-zag),
    its tensor rank's slice of that share."""
    at = mesh.coords(rank)
    mine = tokens.chunk(mesh.dp, dim=0)[at["dp"]]
    share = shard_sequence(mine, at["cp"], mesh.cp, CP_LAYOUT, dim=1)
    return share.chunk(mesh.tp, dim=1)[at["tp"]].contiguous()


@dataclass
class RankResult:
    losses: list[float]
    """The whole batch's mean loss of each step (the same on every rank)."""
    parameters: dict[str, tuple[torch.Tensor, int | None]]
    """The final parameters this rank holds, as :meth:`Stage.named_full_parameters`."""
    calls: list[Call]
    """Every c10d operation of the last step (:class:`~utils.capstone.traffic.CommLedger`), if recorded."""
    n_params: int
    """Values of the parameters this rank holds (its ZeRO group shards their state)."""


def loss_share(logits: torch.Tensor, targets: torch.Tensor, mesh: Mesh) -> torch.Tensor:
    """This rank's share of a micro-batch's mean loss: its tokens' summed cross-entropy over the tokens of its
    context share, which its tensor group splits ``tp`` ways (so ``targets.numel() * tp`` of them)."""
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
    return ce / (targets.numel() * mesh.tp)


def finish_gradients(stage: Stage, zero: ZeroTwoOptimizer, groups: dict) -> None:
    """Sum the reduced gradient slices of the parameters every tensor rank holds whole over the tensor group."""
    with torch.no_grad():
        for p in stage.tp_replicated_parameters():
            dist.all_reduce(zero.shard_of(p).grad, group=groups[("tp",)])


@dataclass(frozen=True)
class Pieces:
    """The three functions a 4D step needs beyond the book's modules (the lab has the reader write them)."""

    local_tokens: Callable[[torch.Tensor, Mesh, int], torch.Tensor] = local_tokens
    loss_share: Callable[[torch.Tensor, torch.Tensor, Mesh], torch.Tensor] = loss_share
    finish_gradients: Callable[[Stage, ZeroTwoOptimizer, dict], None] = finish_gradients


def _train_rank(rank: int, world_size: int, mesh: Mesh, steps: int, seed: int, dtype: torch.dtype,
                lr: float, record_traffic: bool = False, pieces: Pieces = Pieces()) -> RankResult:
    groups = new_groups(mesh, rank, GROUPS)
    model = make_model(seed, dtype)
    stage = Stage(model, mesh, rank, groups, SEQ_LEN)
    del model
    zero = ZeroTwoOptimizer(list(stage.parameters()), torch.optim.Adam, group=groups[("cp", "dp")], lr=lr)
    local_seq = SEQ_LEN // (mesh.cp * mesh.tp)
    stages = [stage if s == mesh.coords(rank)["pp"] else None for s in range(mesh.pp)]
    losses = []
    ledger = CommLedger(group_labels(groups))
    for step in range(steps):
        if record_traffic and step == steps - 1:
            ledger.__enter__()
        inputs, targets = (pieces.local_tokens(t, mesh, rank) for t in make_batch(step, seed))
        run = run_schedule("1f1b", stages, inputs, targets, MICROBATCHES,
                           loss_fn=lambda logits, y: pieces.loss_share(logits, y, mesh),
                           activation_shape=(inputs.shape[0] // MICROBATCHES, local_seq, CONFIG.dim),
                           group=groups[("pp",)], activation_dtype=dtype)
        pieces.finish_gradients(stage, zero, groups)
        zero.step()
        zero.zero_grad()
        # The step's loss: the last stage's shares summed over tensor ranks, averaged over data x context.
        loss = torch.tensor([run.loss if stage.last else 0.0], dtype=torch.float64)
        dist.all_reduce(loss)
        losses.append(loss.item() / (mesh.dp * mesh.cp))
    if record_traffic:
        ledger.__exit__(None, None, None)
    return RankResult(losses, stage.named_full_parameters(), ledger.calls, sum(p.numel() for p in stage.parameters()))


@dataclass
class Run:
    """What :func:`run_4d` returns."""

    losses: list[float]
    """The batch's mean loss of each step."""
    parameters: dict[str, torch.Tensor]
    """The final parameters under the one-process model's names, tensor shards put back together."""
    traffic: list[list[Row]]
    """For each rank, the last step's bytes per (group, operation) against part 2's formulas; empty unless recorded."""


def run_4d(dp: int, tp: int, pp: int, cp: int, steps: int = 4, seed: int = 0, dtype: torch.dtype = torch.float64,
           lr: float = LR, record_traffic: bool = False, pieces: Pieces = Pieces(), timeout: float = 300) -> Run:
    """Train on ``dp * tp * pp * cp`` gloo ranks; optionally count the last step's traffic
    (:func:`~utils.capstone.traffic.predicted_wire_bytes` gives the formula column)."""
    mesh = check_layout(dp, tp, pp, cp)
    check_positive_int("steps", steps)
    results = launch(_train_rank, mesh.world_size, mesh, steps, seed, dtype, lr, record_traffic, pieces,
                     backend="gloo", timeout=timeout)
    params = {}
    for p in range(pp):
        ranks = [results[mesh.rank(pp=p, tp=t)] for t in range(tp)]
        for name, (tensor, dim) in ranks[0].parameters.items():
            params[name] = tensor if dim is None else torch.cat([r.parameters[name][0] for r in ranks], dim=dim)
    traffic = []
    if record_traffic:
        e = torch.empty(0, dtype=dtype).element_size()
        traffic = [compare(r.calls, predicted_wire_bytes(mesh, rank, CONFIG, SEQ_LEN, BATCH, MICROBATCHES, e,
                                                          r.n_params)) for rank, r in enumerate(results)]
    return Run(results[0].losses, params, traffic)


def train(dp: int, tp: int, pp: int, cp: int, steps: int = 4, seed: int = 0, dtype: torch.dtype = torch.float64,
          lr: float = LR, pieces: Pieces = Pieces()) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Each step's loss and the final parameters of :func:`run_4d`; ``pieces`` replaces the functions of
    :class:`Pieces` (a lab's own versions)."""
    run = run_4d(dp, tp, pp, cp, steps, seed, dtype, lr, pieces=pieces)
    return run.losses, run.parameters


def step_traffic(dp: int, tp: int, pp: int, cp: int, dtype: torch.dtype = torch.float64) -> list[list[Row]]:
    """For each rank, what one training step (the second) moved on each group, measured against part 2's formulas."""
    return run_4d(dp, tp, pp, cp, steps=2, dtype=dtype, record_traffic=True).traffic


def train_losses(dp: int, tp: int, pp: int, cp: int, steps: int = 4, seed: int = 0,
                 dtype: torch.dtype = torch.float64) -> list[float]:
    """The loss of each of ``steps`` optimizer steps on a ``(dp, tp, pp, cp)`` mesh; ``(1, 1, 1, 1)`` is one process
    of the same code. ``ValueError`` for a layout the model or batch cannot be cut into (:func:`check_layout`)."""
    return train(dp, tp, pp, cp, steps, seed, dtype)[0]
