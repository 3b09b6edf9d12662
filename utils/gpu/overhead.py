"""Where the time goes: compute, memory bandwidth, or overhead.

Horace He ("Making Deep Learning Go Brrrr From First Principles", horace.io/brrr_intro.html,
2022) splits the time of a deep-learning program into three parts: *compute* (time
spent on floating-point operations), *memory* (time spent moving tensors) and
*overhead* (everything else: the Python interpreter, the framework's dispatcher,
kernel launches). A program is in the regime whose part dominates.

This module measures and models the three:

- :func:`breakdown` splits a measured time into the roofline's lower bounds
  ``F / P`` (compute) and ``Q / B`` (memory) and what neither explains (overhead),
  and names the regime;
- :func:`fit_line` is the least-squares fit ``seconds = intercept + slope * k`` used
  to turn the times of chains of ``k`` operations into a cost per operation;
- :func:`fit_overhead_bandwidth` fits ``t(n) = t_0 + n * bytes_per_element / B`` to
  per-operation times over tensor sizes ``n``: a fixed overhead ``t_0`` and a
  bandwidth ``B``; :func:`crossover_elements` is the size where the two terms are
  equal, ``n* = t_0 B / bytes_per_element``: below it an operation is overhead-bound,
  above it bandwidth-bound;
- :func:`launch_bound_step_seconds` is the time of a step of many small kernels when
  the CPU must issue each one;
- :data:`CUDA_GRAPHS_BLOG` holds the per-kernel times of NVIDIA's "Getting Started with
  CUDA Graphs" (2019), for pages read without a GPU;
- :func:`plot_per_op_time` draws per-operation time against tensor size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from utils.published import Published
from utils.validate import check_nonnegative, check_positive, check_positive_int

REGIMES = ("compute", "memory", "overhead")

CUDA_GRAPHS_SOURCE = ("A. Gray, \"Getting Started with CUDA Graphs\", NVIDIA Technical Blog, 2019 "
                "(developer.nvidia.com/blog/cuda-graphs): 20 launches of a short kernel per step, 1,000 steps, "
                "time per kernel measured on the CPU wall clock, on a Tesla V100 (SXM2 16 GB) with CUDA 10.1 "
                "(\"we are running on an NVIDIA Tesla V100 GPU using CUDA 10.1\"). Figures as quoted verbatim by "
                "two independent copies of the post")
"""Where :data:`CUDA_GRAPHS_BLOG` comes from, and how it was checked."""
CUDA_GRAPHS_BLOG = MappingProxyType({
    "kernel_seconds": Published(
        2.9e-6, "s", f"{CUDA_GRAPHS_SOURCE}: the kernel's own execution time, from the profiler", "measured"),
    "sync_every_kernel_seconds": Published(
        9.6e-6, "s", f"{CUDA_GRAPHS_SOURCE}: per kernel, with cudaStreamSynchronize after every launch", "measured"),
    "sync_every_step_seconds": Published(
        3.8e-6, "s", f"{CUDA_GRAPHS_SOURCE}: per kernel, synchronising once per step of 20 launches", "measured"),
    "graph_seconds": Published(
        3.4e-6, "s", f"{CUDA_GRAPHS_SOURCE}: per kernel, the 20 launches captured once in a CUDA graph and "
        "replayed with one cudaGraphLaunch per step", "measured"),
})
"""Per-kernel times of NVIDIA's CUDA Graphs blog post, each with its source."""


# --- which regime --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Breakdown:
    """A measured time split into the roofline's compute and memory bounds and the rest.

    ``compute_seconds = flops / peak_flops`` and ``memory_seconds = nbytes / bandwidth``
    are lower bounds; with the two overlapped, ``max`` of them is the least possible
    time, and ``overhead_seconds = seconds - max(compute, memory)`` is what neither explains.
    """

    seconds: float
    compute_seconds: float
    memory_seconds: float

    @property
    def overhead_seconds(self) -> float:
        return max(0.0, self.seconds - max(self.compute_seconds, self.memory_seconds))

    @property
    def achieved_fraction(self) -> float:
        """``max(compute, memory) / seconds``: the fraction of the roof reached (1.0 on the roof)."""
        return max(self.compute_seconds, self.memory_seconds) / self.seconds

    @property
    def regime(self) -> str:
        """``"overhead"`` if it takes more than half the time, else the larger of compute and memory."""
        if self.overhead_seconds > 0.5 * self.seconds:
            return "overhead"
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"


def breakdown(seconds: float, flops: float, nbytes: float, peak_flops: float,
              bandwidth_bytes_per_s: float) -> Breakdown:
    """Split a measured ``seconds`` into compute ``F/P``, memory ``Q/B`` and overhead (the rest).

    A kernel that reaches 90% of its roof spends 10% of its time on overhead in this
    accounting (launch, tail effects, imperfect overlap). A time shorter than the
    roofline's bound is impossible for the chip and raises ``ValueError`` (the
    FLOPs, the bytes or the peak are wrong).
    """
    check_positive("seconds", seconds)
    check_nonnegative("flops", flops)
    check_nonnegative("nbytes", nbytes)
    check_positive("peak_flops (FLOP/s)", peak_flops)
    check_positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    result = Breakdown(float(seconds), flops / peak_flops, nbytes / bandwidth_bytes_per_s)
    if result.achieved_fraction > 1 + 1e-9:
        raise ValueError(f"{seconds:.3g} s is shorter than the roofline allows "
                         f"({max(result.compute_seconds, result.memory_seconds):.3g} s): "
                         "check the FLOPs, bytes and peaks")
    return result


# --- fitting measured times ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """``y = intercept + slope * x``."""

    slope: float
    intercept: float

    def __call__(self, x):
        return self.intercept + self.slope * np.asarray(x, dtype=float)


def _as_arrays(x: Sequence[float], y: Sequence[float], what: str) -> tuple[np.ndarray, np.ndarray]:
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xa.ndim != 1 or xa.shape != ya.shape:
        raise ValueError(f"{what}: x and y must be 1-D and of equal length, got shapes {xa.shape} and {ya.shape}")
    if len(np.unique(xa)) < 2:
        raise ValueError(f"{what}: need at least two distinct x values to fit a line, got {xa.tolist()}")
    if not (np.all(np.isfinite(xa)) and np.all(np.isfinite(ya))):
        raise ValueError(f"{what}: x and y must be finite numbers")
    return xa, ya


def fit_line(x: Sequence[float], y: Sequence[float]) -> Line:
    """Ordinary least squares ``y = intercept + slope * x``.

    With ``x`` the number of operations in a chain and ``y`` the chain's time, the
    slope is the cost of one operation and the intercept the fixed cost of a call.
    """
    xa, ya = _as_arrays(x, y, "fit_line")
    slope, intercept = np.polyfit(xa, ya, 1)
    return Line(float(slope), float(intercept))


@dataclass(frozen=True)
class OverheadModel:
    """``t(n) = overhead_seconds + n * bytes_per_element / bandwidth_bytes_per_s`` per operation."""

    overhead_seconds: float
    bandwidth_bytes_per_s: float
    bytes_per_element: float

    def seconds(self, n_elements):
        return self.overhead_seconds + np.asarray(n_elements, dtype=float) * self.bytes_per_element \
            / self.bandwidth_bytes_per_s

    @property
    def crossover_elements(self) -> float:
        return crossover_elements(self.overhead_seconds, self.bandwidth_bytes_per_s, self.bytes_per_element)


def fit_overhead_bandwidth(n_elements: Sequence[float], per_op_seconds: Sequence[float],
                           bytes_per_element: float) -> OverheadModel:
    """Fit ``t(n) = t_0 + n * bytes_per_element / B`` to per-operation times over tensor sizes ``n``.

    Least squares on the *relative* error (each residual divided by the measured
    time), so the small sizes, where ``t_0`` shows, weigh as much as the large
    ones, where ``B`` shows. ``bytes_per_element`` is the traffic per element of one
    operation (8 for ``x.add_(1)`` in fp32: read 4 bytes, write 4). ``ValueError``
    if the fit gives a non-positive overhead or bandwidth (sizes that do not reach
    both regimes).
    """
    n, t = _as_arrays(n_elements, per_op_seconds, "fit_overhead_bandwidth")
    check_positive("bytes_per_element", bytes_per_element)
    if np.any(n < 0) or np.any(t <= 0):
        raise ValueError("fit_overhead_bandwidth: sizes must be >= 0 and times > 0")
    design = np.stack([np.ones_like(n), n], axis=1) / t[:, None]
    (t0, per_element), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    if t0 <= 0 or per_element <= 0:
        raise ValueError(f"fit_overhead_bandwidth: the fit gave overhead {t0:.3g} s and {per_element:.3g} s per "
                         "element; measure sizes well below and well above the crossover")
    return OverheadModel(float(t0), float(bytes_per_element / per_element), float(bytes_per_element))


def crossover_elements(overhead_seconds: float, bandwidth_bytes_per_s: float, bytes_per_element: float) -> float:
    """Tensor size where moving the data takes as long as the fixed overhead: ``n* = t_0 B / b``.

    Below ``n*`` an elementwise operation is overhead-bound (its time hardly depends
    on its size); above it, bandwidth-bound (its time grows with its size). With a
    5 us launch and an H100's 3.35 TB/s, an fp32 ``x + 1`` (8 bytes per element)
    crosses over at ``5e-6 * 3.35e12 / 8 = 2.1e6`` elements.
    """
    check_positive("overhead_seconds", overhead_seconds)
    check_positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s)
    check_positive("bytes_per_element", bytes_per_element)
    return overhead_seconds * bandwidth_bytes_per_s / bytes_per_element


def launch_bound_step_seconds(n_kernels: int, launch_seconds: float, gpu_seconds: float) -> float:
    """Time of a step of ``n_kernels`` kernels that the CPU issues one by one, each costing ``launch_seconds``.

    Launches are asynchronous, so the CPU issuing and the GPU running overlap: the
    step takes ``max(n_kernels * launch_seconds, gpu_seconds)`` (the first launch's
    latency before the GPU starts is left out). With 2,000 kernels of 5 us launch and
    1 ms of GPU work, 10 ms: the GPU idles 90% of the step.
    """
    check_positive_int("n_kernels", n_kernels)
    check_nonnegative("launch_seconds", launch_seconds)
    check_nonnegative("gpu_seconds", gpu_seconds)
    return max(n_kernels * launch_seconds, gpu_seconds)


# --- figure --------------------------------------------------------------------------------------------------


def plot_per_op_time(n_elements: Sequence[float], per_op_seconds: Sequence[float], model: OverheadModel,
                     title: str = "one x.add_(1), fp32"):
    """Per-operation time against tensor size (log-log), the fitted model, and the crossover ``n*``."""
    import matplotlib.pyplot as plt

    n = np.asarray(n_elements, dtype=float)
    t = np.asarray(per_op_seconds, dtype=float)
    grid = np.logspace(np.log10(max(n.min(), 1)), np.log10(n.max()), 200)
    cross = model.crossover_elements
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.axvspan(grid[0], cross, color="tab:orange", alpha=0.12, label="overhead-bound")
    ax.axvspan(cross, grid[-1], color="tab:blue", alpha=0.10, label="bandwidth-bound")
    ax.loglog(n, t * 1e6, "o", color="k", ms=5, label="measured (slope of the chain fit)")
    ax.loglog(grid, model.seconds(grid) * 1e6, "-", color="tab:red",
              label=f"fit: {model.overhead_seconds * 1e6:.1f} us + n x {model.bytes_per_element:g} B "
                    f"/ {model.bandwidth_bytes_per_s / 1e9:.1f} GB/s")
    ax.axhline(model.overhead_seconds * 1e6, color="tab:orange", ls=":", lw=1)
    ax.axvline(cross, color="gray", ls="--", lw=1)
    ax.text(cross * 1.15, model.overhead_seconds * 1e6 * 1.3, f"n* = {cross:,.0f}", color="gray", fontsize=8)
    ax.set(xlabel="elements in the tensor n", ylabel="time per operation (us)", title=title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig
