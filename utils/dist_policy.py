"""Which backend, start method and device a launch uses.

:func:`utils.dist.launch` and :func:`utils.dist.torchrun_main` decide with
:func:`choose_backend` and :func:`choose_start_method`, pure functions that
take the machine's facts (GPU count, NCCL compiled in, CUDA present, fork
available) as arguments, so every decision can be tested on a CPU.
:func:`default_backend` and :func:`default_start_method` pass this machine's
facts; :func:`worker_device` asks the running process group.

**Which backend** (:func:`choose_backend`). Gloo on a CPU. When NCCL can give every
rank its own GPU, the group is ``"cpu:gloo,cuda:nccl"`` (:data:`NCCL_BACKEND`):
NCCL for CUDA tensors, gloo for CPU ones, because NCCL has no CPU path and most
of the book's labs reduce CPU tensors. Inside a worker, :func:`worker_device`
says where its tensors go: its GPU under NCCL, else the CPU.

**Which start method** (:func:`choose_start_method`). Functions defined in a
notebook cell cannot be pickled by name, which ``spawn`` needs; so on a Linux
machine without CUDA :func:`utils.dist.launch` forks, and otherwise it spawns,
sending the function by value with ``cloudpickle``. Wherever CUDA is present it always
spawns: a forked child cannot use CUDA once the parent has touched the driver
("Cannot re-initialize CUDA in forked subprocess"), and even
``torch.cuda.is_available()`` touches it. Asking for ``fork`` there is refused.
"""

from __future__ import annotations

import multiprocessing as mp

import torch
import torch.distributed as dist

from utils.validate import check_nonnegative_int, check_positive_int

NCCL_BACKEND = "cpu:gloo,cuda:nccl"
"""What reaches ``init_process_group`` when NCCL is chosen: NCCL for CUDA tensors, gloo for CPU tensors."""


def choose_backend(world_size: int, gpu_count: int, nccl_available: bool, requested: str | None = None) -> str:
    """The backend string for ``init_process_group``: ``"gloo"`` or :data:`NCCL_BACKEND`.

    With ``requested=None``, NCCL (mixed with gloo for the CPU) when ``nccl_available``
    and ``gpu_count >= world_size`` (one GPU per rank), else gloo. ``requested="gloo"``
    is taken as is; ``requested="nccl"`` (or :data:`NCCL_BACKEND`) gives :data:`NCCL_BACKEND`
    and raises ``ValueError`` if NCCL is missing or there are fewer GPUs than ranks.
    A pure function of its arguments: :func:`launch` passes this machine's facts.
    """
    check_positive_int("world_size", world_size)
    check_nonnegative_int("gpu_count", gpu_count)
    if requested not in (None, "gloo", "nccl", NCCL_BACKEND):
        raise ValueError(f"backend must be 'gloo', 'nccl' or None, got {requested!r}")
    if requested == "gloo":
        return "gloo"
    nccl_fits = nccl_available and gpu_count >= world_size
    if requested is None:
        return NCCL_BACKEND if nccl_fits else "gloo"
    if not nccl_fits:
        why = "this torch has no NCCL" if not nccl_available else f"only {gpu_count} GPUs are visible"
        raise ValueError(f"backend 'nccl' needs one GPU per rank, but world_size={world_size} and {why}; "
                         "use backend='gloo' or fewer ranks")
    return NCCL_BACKEND


def choose_start_method(requested: str | None, cuda_present: bool, fork_available: bool) -> str:
    """``"fork"`` or ``"spawn"``: fork only where it is available and no CUDA GPU is present, else spawn.

    ``requested="spawn"`` is always honoured; ``requested="fork"`` raises ``ValueError``
    where fork is unavailable or CUDA is present (a forked child cannot initialise
    CUDA once the parent has touched the driver: PyTorch docs, "Multiprocessing best
    practices", CUDA in multiprocessing). A pure function of its arguments.
    """
    if requested not in (None, "fork", "spawn"):
        raise ValueError(f"start_method must be 'fork', 'spawn' or None, got {requested!r}")
    if requested == "fork":
        if not fork_available:
            raise ValueError("start_method='fork' is not available on this platform; use 'spawn' or None")
        if cuda_present:
            raise ValueError("start_method='fork' is refused on a machine with a CUDA GPU: once the parent has "
                             "touched the CUDA driver (even torch.cuda.is_available() does), a forked worker "
                             "fails with 'Cannot re-initialize CUDA in forked subprocess'; use 'spawn' or None")
        return "fork"
    if requested == "spawn" or cuda_present or not fork_available:
        return "spawn"
    return "fork"


def cuda_present() -> bool:
    """Whether this machine has a CUDA GPU, asked without initialising CUDA in this process where possible.

    ``torch.cuda.is_available()`` calls ``cudaGetDeviceCount``, which runs ``cuInit``
    and poisons later forks (unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1``);
    ``torch.cuda.device_count()`` asks NVML first and "will NOT poison fork if NVML
    discovery succeeds" (its docstring, torch 2.13). If NVML fails it falls
    back to ``cudaGetDeviceCount``; a count > 0 then means spawn anyway.
    """
    return torch.cuda.is_initialized() or torch.cuda.device_count() > 0


def default_backend(world_size: int) -> str:
    """:func:`choose_backend` for this machine: :data:`NCCL_BACKEND` with one GPU per rank and NCCL, else ``"gloo"``."""
    return choose_backend(world_size, torch.cuda.device_count(), dist.is_nccl_available())


def default_start_method() -> str:
    """:func:`choose_start_method` for this machine, nothing requested: "fork" on a CPU-only Linux, else "spawn"."""
    return choose_start_method(None, cuda_present(), "fork" in mp.get_all_start_methods())


def worker_device() -> torch.device:
    """The device of this rank: its current GPU when the process group runs NCCL, else the CPU.

    Worker functions put their tensors here, so the same function runs on gloo
    (CPU tensors) and on :data:`NCCL_BACKEND` (each rank's GPU, set by
    :func:`utils.dist.launch` or :func:`utils.dist.torchrun_main`).
    """
    if dist.is_initialized() and "nccl" in dist.get_backend():  # "nccl", or NCCL_BACKEND "cpu:gloo,cuda:nccl"
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
