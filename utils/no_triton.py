"""Stand-ins for ``triton`` and ``triton.language`` where Triton is not installed (macOS, Windows).

Triton publishes wheels for Linux only. So that a page's kernels, and the modules of
:mod:`utils.kernels`, can still be *defined* and read there, a notebook cell imports
these in Triton's place (the kernel modules take them through
:mod:`utils.kernels.triton_or_stand_in`)::

    if device.HAS_TRITON:
        import triton
        import triton.language as tl
    else:
        from utils.no_triton import tl, triton

``@triton.jit`` (and ``triton.autotune``, ``triton.heuristics``) then wrap the
function in a :class:`Kernel` that refuses to launch, with one line that says why
(:data:`utils.device.NO_TRITON`). ``triton.cdiv``, ``triton.next_power_of_2`` and
``triton.Config`` work, since plain Python code (grids, block sizes, the list of
autotuning candidates) uses them. Nothing here computes a kernel's result.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable

from utils.device import NO_TRITON


class Kernel:
    """A ``@triton.jit`` function where Triton is missing: readable, not launchable."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid: Any) -> Callable:
        return self.__call__

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(f"{self.fn.__name__} is a Triton kernel and cannot run here. {NO_TRITON}")


def jit(fn: Callable | None = None, **options: Any) -> Any:
    """``@triton.jit`` and ``@triton.jit(...)``: a :class:`Kernel` that says why it cannot launch."""
    return Kernel(fn) if fn is not None else Kernel


def autotune(*args: Any, **kwargs: Any) -> Callable[[Any], Any]:
    """``triton.autotune(configs=..., key=...)(kernel)``: the kernel, unchanged (it cannot launch anyway)."""
    return lambda kernel: kernel if isinstance(kernel, Kernel) else Kernel(kernel)


heuristics = autotune


class Config:
    """``triton.Config``: the block sizes (``kwargs``), warps and stages of one launch configuration."""

    def __init__(self, kwargs: dict, num_warps: int = 4, num_stages: int = 3, **options: Any) -> None:
        self.kwargs, self.num_warps, self.num_stages = dict(kwargs), num_warps, num_stages
        self.options = options

    def __repr__(self) -> str:
        return f"Config({self.kwargs}, num_warps={self.num_warps}, num_stages={self.num_stages})"


def cdiv(x: int, y: int) -> int:
    """``triton.cdiv``: ``ceil(x / y)`` for positive integers."""
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2``: the smallest power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


class _Language(types.ModuleType):
    """``triton.language``: any name (``tl.constexpr``, ``tl.float32``) is a placeholder that only annotates."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return types.new_class(f"tl.{name}")


class _Triton(types.ModuleType):
    """``triton``: the names above; any other (``triton.testing``) says why it is missing."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"triton.{name} is not available here. {NO_TRITON}")


tl = _Language("triton.language", "Stand-in for triton.language (utils.no_triton).")
triton = _Triton("triton", "Stand-in for triton (utils.no_triton).")
triton.language = tl
triton.__version__ = None
for _fn in (jit, autotune, heuristics, Config, cdiv, next_power_of_2):
    setattr(triton, _fn.__name__, _fn)
