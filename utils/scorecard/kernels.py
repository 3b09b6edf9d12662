"""Scorecard rows of the roofline (part 1, chapter 4) against the book's own kernel recordings: ``roofline_kernels``.

Every row of ``benchmarks/results/<gpu>.json`` that the harness placed on its
roofline (an ``intensity``, FLOPs per byte of minimum HBM traffic) becomes a
row: the recorded rate against the roof at that intensity,
:func:`utils.gpu.roofline.place` on the recording's GPU in the row's own
precision (fp32, fp16 or fp8), expressed in the row's unit (GB/s of minimum
traffic, or TFLOP/s). The roof is a bound, so the relative error is how far
the kernel stays below it. A row recorded twice against two baselines counts
once. The recordings are read when :func:`entries` runs, so a new harness run
moves these rows.
"""

from __future__ import annotations

from functools import partial

from utils import recorded as _recorded
from utils.gpu import roofline as _roofline
from utils.scorecard.record import Entry


def precision_of(shape: str) -> str:
    """The roof's precision for a recorded shape: fp8 for e4m3, fp32 for fp32 rows, else fp16."""
    if "e4m3" in shape or "fp8" in shape:
        return "fp8"
    if "fp32" in shape:
        return "fp32"
    return "fp16"


def roof_in_unit(intensity: float, unit: str, gpu: str, precision: str) -> float:
    """The attainable rate at ``intensity`` in ``unit``: TFLOP/s, or the GB/s of traffic that rate implies."""
    flops = _roofline.place(intensity, gpu, precision).attainable_flops
    if unit == "TFLOP/s":
        return flops / 1e12
    if unit == "GB/s":
        return flops / intensity / 1e9
    raise ValueError(f"a roofline row needs a rate in TFLOP/s or GB/s, got {unit!r}")


def _omits(row: dict, precision: str) -> str:
    kernel = row["kernel"]
    if row["unit"] == "GB/s":
        what = ("a bound on HBM traffic: the datasheet's 3.35 TB/s is not reachable (a plain copy reaches about 90%); "
                "traffic beyond the minimum (re-reads, L2 misses) is not counted")
    else:
        what = ("a bound at the datasheet's dense peak: tile and wave quantization, clocks under load, softmax "
                "on the special function units and the non-matmul work of attention are not counted")
    if "naive" in kernel or "MATH" in kernel:
        what += "; intensity of S and P written to HBM, but the kernel is launch- and softmax-bound"
    if precision == "fp8":
        what += "; placed under the fp8 roof (the harness's roofline plot draws every row under fp16's)"
    return what


def entries(name: str = _recorded.DEFAULT) -> list[Entry]:
    """One row per recorded (kernel, shape) with an intensity, in recorded order."""
    data = _recorded.load(name)
    header = data["header"]
    gpu = header["spec"]
    source = (f"benchmarks/results/{name}.json (python -m benchmarks), recorded {header['date_utc']} on an "
              f"{header['device']}, torch {header['torch']}, triton {header['triton']}, CUDA {header['cuda']}")
    out, seen = [], set()
    for row in data["results"]:
        key = (row["kernel"], row["shape"])
        if not row.get("intensity") or key in seen:
            continue
        seen.add(key)
        precision = precision_of(row["shape"])
        out.append(Entry("roofline_kernels", f"{row['kernel']}, {row['shape']}", source,
                         {"gpu": gpu, "precision": precision, "intensity_flops_per_byte": row["intensity"],
                          "shape": row["shape"]},
                         "achieved rate" if row["unit"] == "TFLOP/s" else "achieved rate of minimum HBM traffic",
                         row["unit"], row["value"],
                         partial(roof_in_unit, row["intensity"], row["unit"], gpu, precision),
                         "holdout", _omits(row, precision)))
    return out
