"""Count what a 4D step moves: every collective and send one rank issues, by group, against part 2's formulas.

:class:`CommLedger` is a ``TorchDispatchMode`` that sees each ``torch.ops.c10d`` operation a rank issues
(an all-gather, reduce-scatter, all-reduce, send, receive or barrier, from whichever module called it)
with its tensors and its process group, and records a :class:`Call`: the operation, the mesh group it
ran on, and the bytes of the whole buffer (an all-gather's output, a reduce-scatter's input, an
all-reduce's tensor, a sent tensor). :attr:`Call.wire_bytes` is what that rank puts on the wire in a
ring: ``(n - 1)/n`` of the buffer for an all-gather or reduce-scatter over ``n`` ranks, twice that for
an all-reduce, the whole tensor for a send (Thakur et al. 2005, the bandwidth terms of the ring
algorithms; part 2's collectives chapter).

:func:`predicted_wire_bytes` writes the same per-rank totals from part 2's formulas for one training
step of :mod:`utils.capstone.parallel_4d`, term by term, so the measured ledger can be checked row by
row and every difference named.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from utils.attention.llama import LlamaConfig
from utils.capstone.mesh import Mesh
from utils.parallel.frontier.context_parallel import ring_step_costs
from utils.parallel.memory import tensor_parallel_allreduce_bytes_per_layer
from utils.parallel.model.pipeline_exec import stage_layers

OPS = {"_allgather_base_": "all-gather", "_reduce_scatter_base_": "reduce-scatter", "allreduce_": "all-reduce",
       "send": "send", "recv_": "recv", "barrier": "barrier", "allgather_": "all-gather",
       "reduce_scatter_": "reduce-scatter", "broadcast_": "broadcast"}
"""Names of the c10d operations the ledger sees, as the book calls them."""
WIRE_FACTOR = {"all-gather": 1.0, "reduce-scatter": 1.0, "all-reduce": 2.0, "broadcast": 1.0}


@dataclass(frozen=True)
class Call:
    op: str
    group: str
    """The mesh dimensions of the group (``"tp"``, ``"cp+dp"``, ...), or ``"world"``."""
    group_size: int
    nbytes: int
    """Bytes of the whole buffer: an all-gather's output, a reduce-scatter's input, an all-reduce's or a send's tensor."""

    @property
    def wire_bytes(self) -> float:
        """Bytes this rank sends: ``(n-1)/n`` of the buffer (twice for all-reduce), a send's tensor, 0 otherwise."""
        if self.op == "send":
            return float(self.nbytes)
        n = self.group_size
        return WIRE_FACTOR.get(self.op, 0.0) * (n - 1) / n * self.nbytes


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class CommLedger(TorchDispatchMode):
    """Record every c10d operation issued inside ``with CommLedger(labels):`` on this rank (thread).

    ``labels`` maps a process group's ``group_name`` (unique to each ``dist.new_group``, so two groups of
    the same ranks stay apart) to its name; other groups are named ``"world"`` when they hold every rank,
    else by their ranks.
    """

    def __init__(self, labels: dict[str, str]) -> None:
        super().__init__()
        self.labels, self.calls = dict(labels), []

    def _group(self, args) -> tuple[str, int]:
        for a in args:
            if isinstance(a, torch.ScriptObject):
                group = dist.ProcessGroup.unbox(a)
                ranks = sorted(dist.get_process_group_ranks(group))
                name = self.labels.get(group.group_name) or (
                    "world" if len(ranks) == dist.get_world_size() else str(ranks))
                return name, len(ranks)
        return "world", dist.get_world_size()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            op = OPS.get(func._opname, func._opname)
            tensors = args[0] if op in ("all-reduce", "send", "recv", "broadcast") else (
                args[1] if op == "reduce-scatter" else args[0])
            group, size = self._group(args)
            self.calls.append(Call(op, group, size, _nbytes(tensors)))
        return func(*args, **(kwargs or {}))


def group_labels(groups: dict[tuple[str, ...], dist.ProcessGroup]) -> dict[str, str]:
    """Names of a rank's mesh groups (as :func:`~utils.capstone.mesh.new_groups` returns them): ``{group_name: "cp+dp"}``."""
    return {group.group_name: "+".join(dims) for dims, group in groups.items()}


def totals(calls: list[Call]) -> dict[tuple[str, str], dict[str, float]]:
    """``{(group, op): {"calls": n, "wire_bytes": b}}`` summed over ``calls``."""
    out: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: {"calls": 0, "wire_bytes": 0.0})
    for c in calls:
        out[(c.group, c.op)]["calls"] += 1
        out[(c.group, c.op)]["wire_bytes"] += c.wire_bytes
    return dict(out)


def predicted_wire_bytes(mesh: Mesh, rank: int, config: LlamaConfig, seq_len: int, batch: int, microbatches: int,
                         element_size: int, stage_params: int) -> dict[tuple[str, str], float]:
    """Part 2's per-rank bytes for one step of :mod:`utils.capstone.parallel_4d` on ``rank``, by (group, op).

    With ``m`` micro-batches of ``b = batch / (dp m)`` sequences, a context share of ``s = seq_len / cp``
    tokens, hidden size ``h`` and ``L`` layers on this rank's stage:

    - TP: Megatron's four all-reduces of ``s b h`` per layer per micro-batch
      (:func:`~utils.parallel.memory.tensor_parallel_allreduce_bytes_per_layer`), with sequence
      parallelism four all-gathers and four reduce-scatters of the same buffer, plus the two re-gathers
      of backward (Korthikanti et al. 2022, section 4.2.2): ``6`` all-gathers and ``4`` reduce-scatters.
      The planner prices the four all-reduces and leaves the re-gathers out (its ``BLIND_SPOTS``).
    - CP: ring attention's ``cp - 1`` K/V steps forward and ``cp - 1`` K/V + dK/dV steps backward per
      layer per micro-batch (:func:`~utils.parallel.frontier.context_parallel.ring_step_costs`, the
      planner's term), on this rank's ``n_kv / tp`` heads.
    - PP: one activation of ``b (s / tp) h`` sent forward per micro-batch (all but the last stage) and
      one gradient sent back (all but the first): the planner's ``s b h / t`` per send.
    - DP x CP: ZeRO-2's reduce-scatter of the stage's gradients and all-gather of its parameters, once
      per step each (the planner's DP term, :func:`~utils.parallel.planning.planner.dp_phase_seconds`),
      of ``stage_params`` values on this rank.
    """
    at = mesh.coords(rank)
    m, b, s, h = microbatches, batch // (mesh.dp * microbatches), seq_len // mesh.cp, config.dim
    layers = len(stage_layers(config.n_layers, mesh.pp)[at["pp"]])
    t, e = mesh.tp, element_size
    out: dict[tuple[str, str], float] = {}
    buffer = tensor_parallel_allreduce_bytes_per_layer(s, b, h, e)
    out[("tp", "all-gather")] = 6 * layers * m * (t - 1) / t * buffer
    out[("tp", "reduce-scatter")] = 4 * layers * m * (t - 1) / t * buffer
    if mesh.cp > 1:
        kv_heads = config.n_kv_heads // t
        fwd, _ = ring_step_costs(s, config.n_heads // t, kv_heads, config.head_dim, b, element_size=e)
        bwd, _ = ring_step_costs(s, config.n_heads // t, kv_heads, config.head_dim, b, element_size=e,
                                 backward=True, grad_element_size=e)
        out[("cp", "send")] = layers * m * (mesh.cp - 1) * (fwd + bwd)
    if mesh.pp > 1:
        sends = (at["pp"] < mesh.pp - 1) + (at["pp"] > 0)
        out[("pp", "send")] = sends * m * b * (s // t) * h * e
    n = mesh.dp * mesh.cp
    out[("cp+dp", "reduce-scatter")] = (n - 1) / n * stage_params * e
    out[("cp+dp", "all-gather")] = (n - 1) / n * stage_params * e
    return out


@dataclass(frozen=True)
class Row:
    group: str
    op: str
    calls: int
    measured: float
    predicted: float

    @property
    def ratio(self) -> float:
        """measured / predicted (``inf`` for traffic no formula counts)."""
        return self.measured / self.predicted if self.predicted else float("inf")


def compare(calls: list[Call], predicted: dict[tuple[str, str], float]) -> list[Row]:
    """One row per (group, operation) that moves bytes: calls and wire bytes measured against predicted."""
    measured = totals(calls)
    keys = sorted(k for k in set(measured) | set(predicted)
                  if measured.get(k, {}).get("wire_bytes", 0) or predicted.get(k, 0))
    return [Row(g, op, int(measured.get((g, op), {}).get("calls", 0)),
                measured.get((g, op), {}).get("wire_bytes", 0.0), predicted.get((g, op), 0.0)) for g, op in keys]
