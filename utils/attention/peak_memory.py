"""Peak bytes of tensor memory a piece of PyTorch code allocates, on any device (CPU included).

``torch.cuda.max_memory_allocated`` answers this on a GPU only. The book's
chapters also run on CPUs, so :func:`peak_tensor_bytes` tracks allocations
itself: a ``TorchDispatchMode`` sees every ATen operation run inside it
(forward, and backward when ``loss.backward()`` is called inside, since CPU
autograd runs on the calling thread), adds the size of each new storage an
operation returns, and subtracts it when the storage is freed
(``weakref.finalize``; PyTorch keeps one Python object per storage). The peak
of that running sum is the largest amount of memory the code held at once,
beyond its inputs, as an allocator would see it (without the allocator's
rounding and caching).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class _StorageTracker(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _release(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                key = id(storage)
                if key not in self._seen and storage.nbytes() > 0:
                    self._seen.add(key)
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(storage, self._release, key, storage.nbytes())
        return out


def peak_tensor_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``(fn(), peak)``: the result of ``fn()`` and the peak bytes of tensor storage it held at once.

    Inputs that exist before the call are not counted; storages that ``fn``
    allocates and frees are counted while they live. Storages are counted
    once however many views share them.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    tracker = _StorageTracker()
    with tracker:
        result = fn()
    return result, tracker.peak
