"""Bytes autograd saves for backward: the activation memory of a forward pass, measured.

Autograd keeps, between forward and backward, exactly the tensors the
operations saved (``ctx.save_for_backward`` and the built-in ops' saved
inputs and outputs). ``torch.autograd.graph.saved_tensors_hooks(pack,
unpack)`` calls ``pack`` on each of them as it is saved. Summing their
storages, each counted once however many views or ops share it, and leaving
out the parameters (model state, not activations) gives the activation
bytes that Korthikanti et al. (arXiv:2205.05198, section 4) count per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch


@dataclass
class SavedActivations:
    """What one forward pass saved for backward: total bytes, and each storage's shape and bytes, in order."""

    nbytes: int = 0
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # bytes of each storage, in the order of ``shapes``


def _local(t: torch.Tensor) -> torch.Tensor:
    """A ``DTensor``'s shard on this rank (it owns no storage itself); any other tensor unchanged."""
    return t.to_local() if hasattr(t, "to_local") else t


def saved_activation_bytes(fn: Callable[[], Any], exclude: Iterable[torch.Tensor] = ()
                           ) -> tuple[Any, SavedActivations]:
    """``(fn(), saved)``: run ``fn`` and count the bytes of every storage autograd saved during it.

    Each storage is counted once (by its address), with its full size; tensors
    whose storage is one of ``exclude``'s (pass the model's parameters) are not
    counted. A ``DTensor`` counts as its local shard. Raises ``ValueError`` if ``fn`` is not callable.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    skip = {_local(t).untyped_storage().data_ptr() for t in exclude}
    seen: set[int] = set()
    saved = SavedActivations()

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = _local(t).untyped_storage()
        key = storage.data_ptr()
        if key not in skip and key not in seen and storage.nbytes() > 0:
            seen.add(key)
            saved.nbytes += storage.nbytes()
            saved.shapes.append(tuple(_local(t).shape))
            saved.sizes.append(storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    return result, saved
