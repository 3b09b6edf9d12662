"""Arithmetic intensity of the operations of a transformer, and where they fall on a GPU's roofline.

Arithmetic intensity is FLOPs per byte moved to or from memory (HBM). The
roofline model (Williams, Waterman and Patterson, "Roofline: an insightful
visual performance model for multicore architectures", CACM 52(4), 2009) bounds
a kernel's speed by ``min(peak_flops, intensity * bandwidth)``: below the
*ridge point* ``peak_flops / bandwidth`` it is memory-bound, above it
compute-bound. The roof itself is :func:`utils.gpu.hardware.attainable_flops`.

Each ``*_cost`` function returns an :class:`OpCost` (FLOPs and bytes for the
given shapes, counting each input read once and each output written once,
the minimum traffic an ideal kernel needs); each ``*_intensity`` function
returns its FLOPs per byte. ``dtype_bytes`` is the size of one element
(4 for fp32, 2 for fp16/bf16, 1 for fp8). :func:`place` puts an intensity on a
chip's roofline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from utils.bench import matmul_flops
from utils.gpu import hardware
from utils.validate import check_nonnegative, check_nonnegative_int, check_positive, check_positive_int

BOUNDS = ("memory", "compute")
SOFTMAX_FLOPS_PER_ELEMENT = 5.0
"""max, subtract, exp, sum, divide: one of each per element (a convention; exp is costlier in hardware)."""


@dataclass(frozen=True)
class OpCost:
    """FLOPs and bytes moved of one operation; ``intensity = flops / nbytes`` (FLOPs/byte)."""

    flops: float
    nbytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.nbytes


def _check_positive_ints(**values: int) -> None:
    for name, value in values.items():
        check_positive_int(name, value)


def _check_dtype_bytes(dtype_bytes: float) -> None:
    check_positive("dtype_bytes (4 for fp32, 2 for fp16/bf16, 1 for fp8)", dtype_bytes, finite=True)


# --- operations ----------------------------------------------------------------------------------------------


def matmul_cost(m: int, n: int, k: int, dtype_bytes: float) -> OpCost:
    """(m x k) @ (k x n): ``2 m n k`` FLOPs over ``(m k + k n + m n) * dtype_bytes`` bytes.

    Reads A and B once and writes C once. A square n x n x n matmul has
    intensity ``2 n^3 / (3 n^2 b) = 2n / (3b)``. NVIDIA's "GPU Performance
    Background User's Guide", Table 1, gives 315 FLOPs/B for a linear layer
    with 4096 outputs, 1024 inputs and batch 512 in fp16 (m=512, n=4096, k=1024).
    """
    _check_positive_ints(m=m, n=n, k=k)
    _check_dtype_bytes(dtype_bytes)
    return OpCost(float(matmul_flops(m, n, k)), float(m * k + k * n + m * n) * dtype_bytes)


def matmul_intensity(m: int, n: int, k: int, dtype_bytes: float) -> float:
    """FLOPs per byte of an (m x k) @ (k x n) matmul: ``2mnk / ((mk + kn + mn) * dtype_bytes)``."""
    return matmul_cost(m, n, k, dtype_bytes).intensity


def elementwise_cost(n_elements: int, flops_per_element: float, dtype_bytes: float, n_inputs: int = 1,
                     n_outputs: int = 1) -> OpCost:
    """An elementwise op on ``n_elements``: ``flops_per_element * n`` FLOPs over ``(n_inputs + n_outputs) n b`` bytes.

    ReLU or dropout: about 1 FLOP per element, one input, one output. A vector
    add ``z = x + y``: 1 FLOP, two inputs, one output.
    """
    _check_positive_ints(n_elements=n_elements, n_outputs=n_outputs)
    check_nonnegative_int("n_inputs", n_inputs)
    check_nonnegative("flops_per_element", flops_per_element)
    _check_dtype_bytes(dtype_bytes)
    return OpCost(float(flops_per_element) * n_elements, float(n_inputs + n_outputs) * n_elements * dtype_bytes)


def elementwise_intensity(flops_per_element: float, dtype_bytes: float, n_inputs: int = 1,
                          n_outputs: int = 1) -> float:
    """FLOPs per byte of an elementwise op: ``flops_per_element / ((n_inputs + n_outputs) * dtype_bytes)``.

    ReLU in fp32: 1 / 8. In fp16: 1 / 4 = 0.25, the figure of NVIDIA's "GPU
    Performance Background User's Guide", Table 1. Vector add in fp32: 1 / 12.
    """
    return elementwise_cost(1, flops_per_element, dtype_bytes, n_inputs, n_outputs).intensity


def reduction_cost(n_rows: int, n_cols: int, dtype_bytes: float) -> OpCost:
    """Sum of each row of an (n_rows x n_cols) matrix.

    ``n_rows (n_cols - 1)`` adds over ``(n_rows n_cols + n_rows) * dtype_bytes``
    bytes: the matrix read once, one sum per row written.
    """
    _check_positive_ints(n_rows=n_rows, n_cols=n_cols)
    _check_dtype_bytes(dtype_bytes)
    return OpCost(float(n_rows * (n_cols - 1)), float(n_rows * n_cols + n_rows) * dtype_bytes)


def reduction_intensity(n_rows: int, n_cols: int, dtype_bytes: float) -> float:
    """FLOPs per byte of a row sum: ``(n_cols - 1) / ((n_cols + 1) * dtype_bytes)``, about ``1 / dtype_bytes``."""
    return reduction_cost(n_rows, n_cols, dtype_bytes).intensity


def softmax_cost(n_rows: int, n_cols: int, dtype_bytes: float,
                 flops_per_element: float = SOFTMAX_FLOPS_PER_ELEMENT) -> OpCost:
    """Row-wise softmax of an (n_rows x n_cols) matrix, fused: one read and one write of the matrix.

    ``flops_per_element * n_rows * n_cols`` FLOPs (max, subtract, exp, sum,
    divide) over ``2 * n_rows * n_cols * dtype_bytes`` bytes.
    """
    _check_positive_ints(n_rows=n_rows, n_cols=n_cols)
    return elementwise_cost(n_rows * n_cols, flops_per_element, dtype_bytes, n_inputs=1, n_outputs=1)


def softmax_intensity(dtype_bytes: float, flops_per_element: float = SOFTMAX_FLOPS_PER_ELEMENT) -> float:
    """FLOPs per byte of a fused softmax: ``flops_per_element / (2 * dtype_bytes)`` (5/8 in fp32)."""
    return elementwise_intensity(flops_per_element, dtype_bytes, n_inputs=1, n_outputs=1)


def attention_cost(seq_len: int, head_dim: int, dtype_bytes: float, fused: bool,
                   block_rows: int | None = None, kv_reuse: str = "none") -> OpCost:
    """One head of attention ``O = softmax(Q K^T) V`` with Q, K, V, O of shape (seq_len x head_dim).

    FLOPs: ``4 S^2 d``, the two matmuls Q K^T and P V (the softmax's ~5 S^2 is
    left out, as in the FlashAttention papers' FLOP counts).

    Bytes, with S = ``seq_len``, d = ``head_dim``, b = ``dtype_bytes``:

    - ``fused=False``: standard attention (Dao et al., "FlashAttention",
      arXiv:2205.14135, Algorithm 0) writes the S x S scores to HBM and reads
      them back: read Q, K, write S; read S, write P; read P, V, write O:
      ``(4 S d + 4 S^2) b``.
    - ``fused=True``: the scores stay in on-chip SRAM; Q is read and O written
      once. K and V are read once per block of ``block_rows`` query rows
      (the outer loop of FlashAttention-2, Dao, arXiv:2307.08691, Algorithm 1),
      ``ceil(S / block_rows)`` times; with
      ``block_rows=None`` they are read once, the ideal ``4 S d b``.

    ``kv_reuse="l2"`` counts what HBM sees when those re-reads hit the L2
    cache (all row tiles of a head run at once and its K and V fit in L2,
    :func:`utils.attention.flash_reference.kv_working_set_bytes`): K and V
    once, ``4 S d b``, whatever ``block_rows``. That is what an H100 shows
    (``benchmarks/results``: a kernel with 64-row tiles above the 64 FLOP/byte
    roof the re-read count puts it under). The default ``"none"`` keeps the
    paper's one-level count, an upper bound on HBM traffic.
    """
    _check_positive_ints(seq_len=seq_len, head_dim=head_dim)
    _check_dtype_bytes(dtype_bytes)
    if not isinstance(fused, bool):
        raise ValueError(f"fused must be True or False, got {fused!r}")
    if kv_reuse not in ("none", "l2"):
        raise ValueError(f"kv_reuse must be 'none' (re-reads from HBM) or 'l2' (re-reads hit L2), got {kv_reuse!r}")
    s, d = seq_len, head_dim
    flops = 4.0 * s * s * d
    if not fused:
        if block_rows is not None or kv_reuse != "none":
            raise ValueError("block_rows and kv_reuse only apply to fused attention (fused=True)")
        return OpCost(flops, (4.0 * s * d + 4.0 * s * s) * dtype_bytes)
    kv_passes = 1
    if block_rows is not None:
        _check_positive_ints(block_rows=block_rows)
        kv_passes = math.ceil(s / block_rows) if kv_reuse == "none" else 1
    return OpCost(flops, (2.0 * s * d + 2.0 * s * d * kv_passes) * dtype_bytes)


def attention_intensity(seq_len: int, head_dim: int, dtype_bytes: float, fused: bool,
                        block_rows: int | None = None, kv_reuse: str = "none") -> float:
    """FLOPs per byte of one attention head (see :func:`attention_cost`).

    Standard: ``S d / ((S + d) b)``, which tends to ``d / b`` (64 for d = 128
    in bf16: memory-bound on every chip of :data:`utils.gpu.hardware.GPUS`).
    Fused, K/V re-read from HBM per ``B_r`` rows: about ``2 B_r / b``
    (``B_r`` in fp16). Fused, ideal or ``kv_reuse="l2"``: ``S / b``, which grows
    with the sequence (2048 at S = 4096 in fp16, the intensity ``benchmarks``
    records for attention).
    """
    return attention_cost(seq_len, head_dim, dtype_bytes, fused, block_rows, kv_reuse).intensity


# --- placing an intensity on a roofline --------------------------------------------------------------------


def ridge_point(gpu: str, precision: str = "bf16") -> float:
    """FLOPs per byte where ``gpu``'s roofline turns: ``peak_flops(precision) / hbm_bandwidth``.

    H100 SXM in bf16: 989.4e12 / 3.35e12 = 295 FLOPs/byte. V100 in fp16:
    125e12 / 900e9 = 138.9, the "ops:byte ratio" of NVIDIA's "GPU Performance
    Background User's Guide".
    """
    g = hardware.spec(gpu)
    return g.flops(precision) / g.hbm_bandwidth


@dataclass(frozen=True)
class Placement:
    """Where an intensity lands on a roofline: attainable FLOP/s, fraction of peak, and what bounds it."""

    gpu: str
    precision: str
    intensity: float
    attainable_flops: float
    peak_flops: float
    ridge_point: float
    bound: str

    @property
    def fraction_of_peak(self) -> float:
        return self.attainable_flops / self.peak_flops


def place(intensity: float, gpu: str = "H100-SXM", precision: str = "bf16") -> Placement:
    """Put ``intensity`` (FLOPs/byte) on ``gpu``'s HBM roofline in ``precision``.

    ``attainable = min(peak, intensity * bandwidth)``
    (:func:`utils.gpu.hardware.attainable_flops`); the bound is ``"memory"`` below
    the ridge point and ``"compute"`` at or above it.
    """
    check_positive("intensity (FLOPs/byte)", intensity)
    g = hardware.spec(gpu)
    peak = g.flops(precision)
    ridge = ridge_point(gpu, precision)
    attainable = hardware.attainable_flops(intensity, peak, g.hbm_bandwidth)
    return Placement(gpu, precision, float(intensity), attainable, peak, ridge,
                     "memory" if intensity < ridge else "compute")


def bound(intensity: float, gpu: str = "H100-SXM", precision: str = "bf16") -> str:
    """``"memory"`` if ``intensity`` is below ``gpu``'s ridge point in ``precision``, else ``"compute"``."""
    return place(intensity, gpu, precision).bound


def min_seconds(cost: OpCost, gpu: str = "H100-SXM", precision: str = "bf16") -> float:
    """Roofline lower bound on the run time: ``max(flops / peak_flops, nbytes / hbm_bandwidth)`` seconds.

    No kernel moving ``cost.nbytes`` through HBM and doing ``cost.flops`` can
    be faster; measured times divided by this give the fraction of the roof reached.
    """
    if not isinstance(cost, OpCost):
        raise ValueError(f"cost must be an OpCost, got {type(cost).__name__}")
    g = hardware.spec(gpu)
    return max(cost.flops / g.flops(precision), cost.nbytes / g.hbm_bandwidth)


def attention_exp_time_ratio(head_dim: int, matmul_flops: float, exp_per_s: float) -> float:
    """Time of one score's exponential over the time of its matmul FLOPs: ``matmul_flops / (4 d exp_per_s)``.

    Each score of attention costs ``4 d`` matmul FLOPs (``2d`` for ``Q K^T``, ``2d`` for
    ``P V``) and one exponential, which runs on the special function units, not the
    Tensor Cores. With an H100 SXM's 989 TFLOP/s of fp16 matmul and its 3.9e12
    exponentials per second, at ``d = 128`` this is 0.50: "exponential can take 50% of the
    cycle time compared to matmul" (Shah et al. 2024, FlashAttention-3, arXiv:2407.08608,
    section 3.1).
    """
    _check_positive_ints(head_dim=head_dim)
    check_positive("matmul_flops", matmul_flops)
    check_positive("exp_per_s", exp_per_s)
    return matmul_flops / (4 * head_dim * exp_per_s)


def attention_serial_exp_bound(head_dim: int, matmul_flops: float, exp_per_s: float) -> float:
    """Attention FLOP/s if the exponentials never overlap the matmuls: ``matmul_flops / (1 + ratio)``.

    ``ratio`` is :func:`attention_exp_time_ratio`. A kernel that runs each tile's softmax
    after its matmul on the same warps cannot beat this however fast its matmuls are;
    FlashAttention-3 overlaps the two to get past it.
    """
    return matmul_flops / (1 + attention_exp_time_ratio(head_dim, matmul_flops, exp_per_s))
