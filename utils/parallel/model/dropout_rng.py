"""Dropout under tensor parallelism: one random stream shared by the ranks, one private to each (Megatron-LM).

Shoeybi et al. (arXiv:1909.08053), Appendix B: dropout *outside* the
tensor-parallel regions acts on activations every rank holds in full (the
residual stream), so every rank must draw the same mask, or their copies
diverge; dropout *inside* acts on each rank's own heads or columns, so the
ranks must draw different masks, or the heads on rank 1 get the very mask of
the heads on rank 0 (a correlated dropout the one-GPU model never applies).
Megatron keeps two generator states (``model_parallel_cuda_manual_seed`` and
``CudaRNGStatesTracker`` in ``megatron/core/tensor_parallel/random.py``): the
default one seeded with ``seed`` on every rank, and a tracked one seeded with
``seed + 2718 + tp_rank``, which code inside a parallel region enters with
``with get_cuda_rng_tracker().fork():``. With sequence parallelism the
"replicated" regions hold different tokens on each rank, so their dropout must
differ too: Megatron-LM then runs the whole transformer block inside the fork
(``megatron/core/transformer/transformer_block.py``). (Pipeline stages get ``seed + 100
pp_rank`` before this, in ``megatron/training/initialize.py``; data-parallel
replicas share the seed unless ``--data-parallel-random-init``: they see
different data anyway.)

This module does the same for torch's default CPU generator, so that plain
``F.dropout`` calls draw from the right stream (Megatron swaps the CUDA one).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

MODEL_PARALLEL_SEED_OFFSET = 2718  # megatron/core/tensor_parallel/random.py ("just for fun")
MODEL_PARALLEL = "model-parallel-rng"


class RNGStatesTracker:
    """Named generator states; :meth:`fork` runs a block on one of them and keeps where it stopped."""

    def __init__(self) -> None:
        self.states: dict[str, torch.Tensor] = {}

    def add(self, name: str, seed: int) -> None:
        """A new stream ``name`` starting from ``seed``; ``ValueError`` if the name exists."""
        if name in self.states:
            raise ValueError(f"RNG state {name!r} already exists")
        generator = torch.Generator()
        generator.manual_seed(seed)
        self.states[name] = generator.get_state()

    @contextmanager
    def fork(self, name: str = MODEL_PARALLEL) -> Iterator[None]:
        """Inside the block, torch's default CPU generator is stream ``name``; outside, untouched."""
        if name not in self.states:
            raise ValueError(f"unknown RNG state {name!r}; known: {sorted(self.states)}")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states[name])
        try:
            yield
        finally:
            self.states[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


def model_parallel_manual_seed(seed: int, tp_rank: int) -> RNGStatesTracker:
    """Megatron's seeding: default generator ``seed`` (same on all TP ranks), tracked one ``seed + 2718 + tp_rank``."""
    if not isinstance(tp_rank, int) or tp_rank < 0:
        raise ValueError(f"tp_rank must be a non-negative int, got {tp_rank!r}")
    torch.manual_seed(seed)
    tracker = RNGStatesTracker()
    tracker.add(MODEL_PARALLEL, seed + MODEL_PARALLEL_SEED_OFFSET + tp_rank)
    return tracker
