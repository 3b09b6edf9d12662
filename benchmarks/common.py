"""What every GPU benchmark script shares: a result row, rates and fractions of peak, the header, the table, the CLI.

A script (``benchmarks.gpu_architecture``, ``benchmarks.attention``) supplies
its cases as a function ``cases(on_gpu, quick, gpu) -> list[Result]`` and calls
:func:`run`, which handles ``--quick``, ``--json``, ``--allow-cpu`` and
``--strict`` the same way for all of them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from dataclasses import asdict, dataclass
from typing import Callable

import utils  # noqa: F401  (first: switches Triton to its interpreter when there is no GPU)
import torch
import triton

from utils import device
from utils.bench import gb_per_s, tflop_per_s
from utils.gpu.hardware import GpuSpec, spec_for_device


@dataclass
class Result:
    """One row of the table. ``value`` and ``baseline_value`` are in ``unit``; fractions are of the chip's peak."""

    kernel: str
    shape: str
    unit: str
    value: float
    baseline: str
    baseline_value: float
    peak_fraction: float | None
    target: str
    verdict: str  # PASS, MISS or n/a

    @property
    def ratio(self) -> float:
        """The kernel's rate over the baseline's (> 1: the kernel is faster)."""
        return self.value / self.baseline_value


def rate_and_fraction(seconds: float, amount: float, unit: str, peak: float | None) -> tuple[float, float | None]:
    """The rate in ``unit`` (GB/s or TFLOP/s) of ``amount`` bytes or FLOPs in ``seconds``, and its fraction of ``peak``."""
    if unit == "GB/s":
        value = gb_per_s(amount, seconds)
    else:
        value = tflop_per_s(amount, seconds)
    scale = 1e9 if unit == "GB/s" else 1e12
    return value, (value * scale / peak if peak else None)


def header(gpu: GpuSpec | None) -> dict[str, str]:
    """What the numbers were measured on: GPU (or CPU), date, versions, and the peak figures used."""
    info = {
        "device": device.gpu_name() or f"CPU ({platform.machine()}), Triton interpreter",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": str(torch.version.cuda),
        "python": platform.python_version(),
    }
    if gpu:
        info["peaks"] = (f"{gpu.name}: HBM {gpu.hbm_bandwidth / 1e12:.2f} TB/s, "
                         f"fp16 {gpu.flops('fp16') / 1e12:.1f} TFLOP/s dense ({gpu.sources[0]})")
    else:
        info["peaks"] = "unknown chip: fractions of peak print as n/a"
    return info


def _num(value: float) -> str:
    """A rate with sensible digits: ``3,012`` or ``41.7`` or ``0.00986`` (interpreter rates are tiny)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 1 else f"{value:.3g}"


def format_table(results: list[Result]) -> str:
    """The results as a fixed-width text table."""
    cols = ("kernel", "shape", "rate", "of peak", "baseline", "ratio", "target", "verdict")
    rows = [(r.kernel, r.shape, f"{_num(r.value)} {r.unit}",
             "n/a" if r.peak_fraction is None else f"{r.peak_fraction:.1%}",
             f"{r.baseline} {_num(r.baseline_value)}", f"{r.ratio:.3g}x", r.target, r.verdict) for r in results]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


Cases = Callable[[bool, bool, "GpuSpec | None"], list[Result]]


def run(prog: str, description: str, cases: Cases, argv: list[str] | None = None) -> int:
    """Parse the shared options, print the header, run ``cases`` and print the table; return the exit code.

    0 done, 1 a target missed with ``--strict``, 2 no GPU (without ``--allow-cpu``).
    """
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=description)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, a minute or two")
    parser.add_argument("--json", metavar="PATH", help="also write the header and results to PATH as JSON")
    parser.add_argument("--allow-cpu", action="store_true", help="with no GPU, run tiny shapes in Triton's "
                        "interpreter as a smoke test (timings say nothing about GPU speed)")
    parser.add_argument("--strict", action="store_true", help="exit with code 1 if any target is missed")
    args = parser.parse_args(argv)

    on_gpu = device.HAS_CUDA and not device.INTERPRETER
    if not on_gpu and not args.allow_cpu:
        print(f"{prog} needs a CUDA GPU (none found, or TRITON_INTERPRET=1 is set). "
              "Pass --allow-cpu to run tiny shapes in Triton's interpreter as a smoke test.", file=sys.stderr)
        return 2
    gpu = spec_for_device(device.gpu_name()) if on_gpu else None
    info = header(gpu)
    for key, value in info.items():
        print(f"{key:>9}: {value}")
    if not on_gpu:
        print("NOTE: CPU smoke test through Triton's interpreter; the rates below say nothing about GPU speed.")
    print(flush=True)

    device.manual_seed(0)
    results = cases(on_gpu, args.quick, gpu)
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": info, "quick": args.quick, "on_gpu": on_gpu,
                       "results": [asdict(r) | {"ratio": r.ratio} for r in results]}, f, indent=2)
        print(f"\nwrote {args.json}")
    missed = [r for r in results if r.verdict == "MISS"]
    return 1 if args.strict and missed else 0
