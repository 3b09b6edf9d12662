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
from pathlib import Path
from typing import Callable

import utils  # noqa: F401  (first: switches Triton to its interpreter when there is no GPU)
import torch
import triton

from utils import device
from utils.bench import gb_per_s, tflop_per_s
from utils.gpu.hardware import GpuSpec, spec_for_device
from utils.recorded import format_rows


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
    intensity: float | None = None
    """FLOPs per byte of minimum HBM traffic: where the kernel sits on a roofline (None: not placed)."""

    @property
    def achieved_flops(self) -> float | None:
        """FLOP/s, for the roofline: a TFLOP/s rate as is, a GB/s rate times the intensity."""
        if not self.intensity:
            return None
        return self.value * 1e12 if self.unit == "TFLOP/s" else self.value * 1e9 * self.intensity

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
        info["spec"] = gpu.name
        info["peaks"] = (f"{gpu.name}: HBM {gpu.hbm_bandwidth / 1e12:.2f} TB/s, "
                         f"fp16 {gpu.flops('fp16') / 1e12:.1f} TFLOP/s dense ({gpu.sources[0]})")
    else:
        info["peaks"] = "unknown chip: fractions of peak print as n/a"
    return info


def format_table(results: list[Result]) -> str:
    """The results as a fixed-width text table (the same as the book prints for recorded rows)."""
    return format_rows([asdict(r) for r in results])


Cases = Callable[[bool, bool, "GpuSpec | None"], list[Result]]


def result_name(gpu: GpuSpec | None, quick: bool, on_gpu: bool) -> str:
    """The file name stem of a recording: ``h100-sxm``, ``h100-sxm-quick``, ``unknown-gpu`` or ``cpu-smoke``."""
    if not on_gpu:
        return "cpu-smoke"
    return (gpu.name.lower() if gpu else "unknown-gpu") + ("-quick" if quick else "")


def record(results: list[Result], info: dict[str, str], quick: bool, on_gpu: bool, gpu: GpuSpec | None,
           directory: str) -> tuple[Path, Path]:
    """Write ``<directory>/<name>.json`` (header and rows) and ``<name>-roofline.png``; return both paths."""
    import matplotlib

    matplotlib.use("agg")
    from utils import recorded

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    stem = result_name(gpu, quick, on_gpu)
    data = {"header": info, "quick": quick, "on_gpu": on_gpu,
            "results": [asdict(r) | {"ratio": r.ratio} for r in results]}
    json_path, png_path = out / f"{stem}.json", out / f"{stem}-roofline.png"
    json_path.write_text(json.dumps(data, indent=2) + "\n")
    fig = recorded.plot_roofline(data, gpu.name if gpu else None)
    fig.savefig(png_path, dpi=120, bbox_inches="tight")
    return json_path, png_path


def run(prog: str, description: str, cases: Cases, argv: list[str] | None = None,
        record_dir: str | None = None) -> int:
    """Parse the shared options, print the header, run ``cases`` and print the table; return the exit code.

    0 done, 1 a target missed with ``--strict``, 2 no GPU (without ``--allow-cpu``). With ``--record DIR``
    (default ``record_dir``) the results also go to ``DIR/<gpu>.json`` with a roofline ``DIR/<gpu>-roofline.png``.
    """
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=description)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, a minute or two")
    parser.add_argument("--json", metavar="PATH", help="also write the header and results to PATH as JSON")
    parser.add_argument("--allow-cpu", action="store_true", help="with no GPU, run tiny shapes in Triton's "
                        "interpreter as a smoke test (timings say nothing about GPU speed)")
    parser.add_argument("--strict", action="store_true", help="exit with code 1 if any target is missed")
    parser.add_argument("--record", metavar="DIR", default=record_dir,
                        help="write DIR/<gpu>.json and DIR/<gpu>-roofline.png" +
                        (f" (default {record_dir})" if record_dir else ""))
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
    if args.record:
        for path in record(results, info, args.quick, on_gpu, gpu, args.record):
            print(f"wrote {path}")
    missed = [r for r in results if r.verdict == "MISS"]
    return 1 if args.strict and missed else 0
