"""A figure quoted from a primary source: one type for every table of published numbers in the package.

The book checks its formulas against numbers printed by vendors and papers,
and each such number travels with its unit and its source, so a page can cite
it (CONVENTIONS: "Published numbers live in one table with their source").
The tables: :data:`utils.parallel.training.PUBLISHED` (training runs),
:data:`utils.parallel.comm.topology.PUBLISHED` (switches, nodes, clusters),
:data:`utils.gpu.memory_hierarchy.PUBLISHED` (per-GPU memory figures the spec
table does not hold), :data:`utils.parallel.memory.ZERO_PAPER_FIGURES`,
:data:`utils.parallel.model.activations.PUBLISHED` (activation memory),
:data:`utils.parallel.mixed_precision.precision.PUBLISHED` (floating-point formats),
:mod:`utils.parallel.planning.published_runs` (Megatron-LM and Llama 3 layouts and
throughput), :data:`utils.parallel.frontier.moe_costs.PUBLISHED` (MoE model sizes) and :data:`utils.attention.allocation.VLLM_TOKEN_STATE_SHARE`.
GPU specifications themselves live in :data:`utils.gpu.hardware.GPUS`, whose
entries carry their sources too.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("vendor", "derived", "measured")
"""How a figure was obtained: published by the vendor, computed from vendor figures, or measured by a study."""


@dataclass(frozen=True)
class Published:
    """``value`` in ``unit``, as printed in ``source``; ``kind`` (one of :data:`KINDS`) where it matters.

    ``source`` names the document and the place in it (table, section, page).
    ``kind`` is None for a paper's own report (a model's size, a run's length),
    where vendor-versus-measured says nothing useful.
    """

    value: float
    unit: str
    source: str
    kind: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError(f"a published figure needs its source, got {self.source!r}")
        if not isinstance(self.unit, str) or not self.unit.strip():
            raise ValueError(f"a published figure needs its unit, got {self.unit!r}")
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS} or None, got {self.kind!r}")
