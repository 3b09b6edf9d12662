"""Vector add in Triton, ``z = x + y``: the reference solution of lab 1 (``labs/01-gpu-architecture/01-vector-add``).

Each *program* (a CUDA thread block, in Triton's terms one instance of the
kernel) handles ``BLOCK_SIZE`` consecutive elements. Program ``pid`` covers the
offsets ``pid * BLOCK_SIZE + [0, 1, ..., BLOCK_SIZE - 1]``; the grid has
``ceil(n / BLOCK_SIZE)`` programs, and the last one masks the lanes that fall
past the end of the array. This follows the structure of Triton's tutorial
``01-vector-add.py`` (triton-lang/triton, ``python/tutorials``).

Vector add does one FLOP per element and moves three elements (two loads, one
store), so its arithmetic intensity is ``1 / (3 * element_size)`` FLOPs per
byte: 1/12 for fp32. It is memory-bound on every GPU; its speed is a
bandwidth measurement.
"""

from __future__ import annotations

import torch

from utils.kernels.triton_or_stand_in import tl, triton
from utils.device import check_tensors
from utils.validate import check_element_size, check_nonnegative_int

DEFAULT_BLOCK_SIZE = 1024
"""Elements per program. 1024 is the block of Triton's tutorial; with 4 warps that is 8 elements per thread."""


@triton.jit
def add_kernel(x_ptr, y_ptr, z_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    """Program ``pid`` writes ``z[i] = x[i] + y[i]`` for its ``BLOCK_SIZE`` offsets that are ``< n_elements``."""
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(z_ptr + offsets, x + y, mask=mask)


def _check_block_size(block_size: int) -> None:
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1 \
            or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a positive power of two (tl.arange needs one), got {block_size!r}")


def grid_size(n_elements: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Programs needed to cover ``n_elements``: ``ceil(n_elements / block_size)``."""
    check_nonnegative_int("n_elements", n_elements)
    _check_block_size(block_size)
    return triton.cdiv(n_elements, block_size)


def add(x: torch.Tensor, y: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """``x + y`` computed by :func:`add_kernel`, as a new tensor of the same shape and dtype.

    ``x`` and ``y`` must be contiguous, of the same shape and dtype, on
    :func:`utils.device.device`; ``block_size`` a power of two.
    """
    check_tensors(x, y)
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.dtype != y.dtype:
        raise ValueError(f"x and y must have the same dtype, got {x.dtype} and {y.dtype}")
    if not (x.is_contiguous() and y.is_contiguous()):
        raise ValueError("x and y must be contiguous (the kernel walks flat offsets); call .contiguous() first")
    _check_block_size(block_size)
    z = torch.empty_like(x)
    n_elements = x.numel()
    if n_elements == 0:
        return z
    add_kernel[(grid_size(n_elements, block_size),)](x, y, z, n_elements, BLOCK_SIZE=block_size)
    return z


def add_nbytes(n_elements: int, element_size: int) -> int:
    """Bytes vector add moves to and from memory: ``3 * n_elements * element_size`` (read x, read y, write z)."""
    check_nonnegative_int("n_elements", n_elements)
    check_element_size(element_size)
    return 3 * n_elements * element_size


def add_intensity(element_size: int) -> float:
    """Arithmetic intensity of vector add in FLOPs per byte: ``1 / (3 * element_size)`` (1/12 for fp32)."""
    return 1 / add_nbytes(1, element_size)
