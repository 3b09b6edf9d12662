"""Which machine a page runs on, and the switch to Triton's interpreter.

With no CUDA GPU, Triton kernels can still run through Triton's interpreter,
which executes each program instance with NumPy on the CPU. The interpreter is
chosen when ``@triton.jit`` decorates a function, by the environment variable
``TRITON_INTERPRET``; this module sets it on import when no GPU is present, so
``import utils`` at the top of a notebook is all a reader needs.

The interpreter has one trap: bfloat16 tensors come back as silent zeros
(NumPy has no bfloat16). :func:`check_dtype` turns that into a clear error.

Triton publishes wheels for Linux only, so on macOS and Windows it is not
installed (requirements.txt installs it under ``sys_platform == "linux"``).
:data:`HAS_TRITON` says whether it is there (importing it, after the interpreter
switch), :func:`describe` and :func:`require_triton` say why not when it is missing,
and :mod:`utils.no_triton` stands in for it so that kernels can still be defined.
"""

from __future__ import annotations

import os
import platform

import torch

HAS_CUDA: bool = torch.cuda.is_available()
"""True when at least one CUDA GPU is visible to PyTorch."""

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRETER: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"
"""True when Triton kernels run through the CPU interpreter."""

_UNSUPPORTED_UNDER_INTERPRETER = {torch.bfloat16: "bfloat16"}

NO_TRITON: str = (
    "Triton is not installed: it publishes wheels for Linux only. On macOS or Windows, run "
    "the Triton cells in the book's dev container (.devcontainer/), under WSL2 or in a hosted "
    "Linux notebook."
)
"""Why a page's Triton cells cannot run here, in one line, for machines without Triton."""


def triton_version() -> str | None:
    """Triton's version (``"3.7.1"``), or None where Triton is not installed.

    Only a missing ``triton`` module counts as not installed; an installed Triton
    that fails to import raises its own error.
    """
    try:
        import triton
    except ModuleNotFoundError as err:
        if err.name != "triton":
            raise
        return None
    return triton.__version__


HAS_TRITON: bool = triton_version() is not None
"""True when Triton can be imported (Linux); False on macOS and Windows, where it has no wheels."""

TRITON_ON_GPU: bool = HAS_CUDA and HAS_TRITON and not INTERPRETER
"""True when Triton kernels compile for this machine's GPU: CUDA, Triton installed, no interpreter.

A page's GPU timings of its Triton kernels are guarded by it, not by :data:`HAS_CUDA`
alone: a Windows machine with an NVIDIA GPU has CUDA but no Triton wheel, and there
those cells show the recorded figures instead.
"""


def require_triton(what: str) -> bool:
    """True when Triton is installed; else print one line, ``"<what> needs Triton: " + NO_TRITON``, and return False.

    A page guards its Triton cells with it: ``if device.require_triton("This check"): ...``.
    """
    if not isinstance(what, str) or not what:
        raise ValueError(f"what must be a non-empty string naming what needs Triton, got {what!r}")
    if HAS_TRITON:
        return True
    print(f"{what} needs Triton: {NO_TRITON}")
    return False


def device() -> torch.device:
    """The device labs put their tensors on: ``cuda`` when present, else ``cpu``."""
    return torch.device("cuda" if HAS_CUDA else "cpu")


def gpu_name() -> str | None:
    """The name of GPU 0 as the driver reports it (``"NVIDIA H100 80GB HBM3"``), or None."""
    return torch.cuda.get_device_name(0) if HAS_CUDA else None


def describe(show: bool = True) -> str:
    """Say what this page is running on, in one line, and return that line.

    Examples: ``"GPU: NVIDIA H100 80GB HBM3 (torch 2.13.0, triton 3.5.0)"``,
    ``"CPU (x86_64), Triton interpreter (torch 2.13.0, triton 3.5.0)"``, or without
    Triton ``"CPU (arm64), without Triton (torch 2.13.0). Triton is not installed: ..."``
    followed by :data:`NO_TRITON`.
    """
    triton = triton_version()
    if triton is None:
        where = f"GPU: {gpu_name()}" if HAS_CUDA else f"CPU ({platform.machine()})"
        text = f"{where}, without Triton (torch {torch.__version__}). {NO_TRITON}"
        if show:
            print(text)
        return text
    versions = f"torch {torch.__version__}, triton {triton}"
    if HAS_CUDA and not INTERPRETER:
        text = f"GPU: {gpu_name()} ({versions})"
    elif HAS_CUDA:
        text = f"GPU: {gpu_name()}, but Triton kernels run in the interpreter ({versions})"
    else:
        text = f"CPU ({platform.machine()}), Triton interpreter ({versions})"
    if show:
        print(text)
    return text


def check_dtype(dtype: torch.dtype) -> torch.dtype:
    """Return ``dtype`` if Triton kernels can compute in it here, else raise ``ValueError``.

    Under the interpreter, bfloat16 inputs give silent zeros, so they are refused.
    """
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"expected a torch.dtype, got {dtype!r}")
    if INTERPRETER and dtype in _UNSUPPORTED_UNDER_INTERPRETER:
        raise ValueError(
            f"{_UNSUPPORTED_UNDER_INTERPRETER[dtype]} is not supported by Triton's CPU "
            "interpreter (it silently returns zeros); use torch.float16 or torch.float32 "
            "here, or run on a GPU"
        )
    return dtype


def check_tensors(*tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` unless every tensor is on :func:`device` in a dtype Triton can use here."""
    want = device().type
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"argument {i} is a {type(t).__name__}, expected a torch.Tensor")
        if t.device.type != want:
            raise ValueError(f"argument {i} is on {t.device}, expected a tensor on {want}")
        check_dtype(t.dtype)


def manual_seed(seed: int = 0) -> None:
    """Seed Python's, NumPy's and PyTorch's random generators, so a page prints the same numbers each run."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
