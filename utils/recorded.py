"""GPU figures recorded by ``python -m benchmarks``, for pages read on a machine without a GPU.

A lab's GPU cell measures live when it runs on a GPU. Without one it calls
:func:`show` for the kernels it would have measured, which prints the recorded
rows with a caption that says where and when they were measured (GPU, date,
versions), and draws them. The recordings live in ``benchmarks/results/<gpu>.json``;
the harness writes them (see ``benchmarks/README.md``), nothing else does.

The same module draws the harness's roofline (:func:`plot_roofline`): every
recorded kernel placed at its arithmetic intensity and achieved FLOP/s under the
chip's datasheet roof (:func:`utils.gpu.hardware.attainable_flops`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from utils.gpu import hardware

RESULTS_DIR = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
"""Where ``python -m benchmarks`` writes its recordings by default."""

DEFAULT = "h100-sxm"
"""The recording the book shows: a full run of the harness on an H100 SXM."""


def available() -> list[str]:
    """Names of the recordings present (``h100-sxm``, ...), without ``.json``."""
    return sorted(p.stem for p in RESULTS_DIR.glob("*.json"))


def load(name: str = DEFAULT) -> dict:
    """The recording ``benchmarks/results/<name>.json``: ``{"header": ..., "results": [row, ...]}``."""
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        raise ValueError(f"no recording named {name!r} in {RESULTS_DIR}; available: {available() or 'none'}")
    return json.loads(path.read_text())


def rows(data: dict, kernels: str | Sequence[str]) -> list[dict]:
    """The rows whose kernel name starts with ``kernels`` (one prefix or several), in recorded order."""
    prefixes = (kernels,) if isinstance(kernels, str) else tuple(kernels)
    return [r for r in data["results"] if r["kernel"].startswith(prefixes)]


def caption(data: dict) -> str:
    """``Recorded on an NVIDIA H100 80GB HBM3 on 2026-11-23 (torch ..., triton ..., CUDA ...) by python -m benchmarks``."""
    h = data["header"]
    quick = ", quick sizes" if data.get("quick") else ""
    return (f"Recorded on an {h['device']} on {h['date_utc'][:10]} (torch {h['torch']}, triton {h['triton']}, "
            f"CUDA {h['cuda']}{quick}) by `python -m benchmarks`; not measured on this machine.")


def _num(value: float) -> str:
    """A rate with sensible digits: ``3,012`` or ``41.7`` or ``0.00986`` (interpreter rates are tiny)."""
    if value != value:
        return "n/a"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 1 else f"{value:.3g}"


def _ratio(value: float, baseline: float) -> str:
    return f"{value / baseline:.3g}x" if baseline == baseline and baseline else "n/a"


def format_rows(rows: Sequence[dict]) -> str:
    """Rows (dicts with the fields of ``benchmarks.common.Result``) as a fixed-width text table."""
    cols = ("kernel", "shape", "rate", "of peak", "baseline", "ratio", "target", "verdict")
    cells = [(r["kernel"], r["shape"], f"{_num(r['value'])} {r['unit']}",
              "n/a" if r["peak_fraction"] is None else f"{r['peak_fraction']:.1%}",
              f"{r['baseline']} {_num(r['baseline_value'])}", _ratio(r['value'], r['baseline_value']),
              r["target"], r["verdict"]) for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def plot_rows(data: dict, kernels: str | Sequence[str], title: str | None = None):
    """Bars of the recorded rates of ``kernels`` next to their baselines; the caption names the GPU and date."""
    import matplotlib.pyplot as plt

    selected = rows(data, kernels)
    if not selected:
        raise ValueError(f"no recorded row starts with {kernels!r}")
    labels = [f"{r['kernel']}\n{r['shape']}" for r in selected]
    y = np.arange(len(selected))
    fig, ax = plt.subplots(figsize=(7, 0.55 * len(selected) + 1.4))
    ax.barh(y - 0.2, [r["value"] for r in selected], 0.4, label="kernel")
    ax.barh(y + 0.2, [r["baseline_value"] for r in selected], 0.4, label="its baseline", alpha=0.6)
    for i, r in enumerate(selected):
        ax.text(r["value"], i - 0.2, f" {_num(r['value'])}", va="center", fontsize=7)
        ax.text(r["baseline_value"], i + 0.2, f" {r['baseline']}", va="center", fontsize=7)
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(selected[0]["unit"])
    h = data["header"]
    ax.set_title(title or f"recorded on an {h['device']}, {h['date_utc'][:10]}", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def show(kernels: str | Sequence[str], name: str = DEFAULT, plot: bool = True,
         published: str | None = None) -> dict | None:
    """Print (and draw) the recorded figures of ``kernels``; return the recording, or None if there is none.

    Where the recording has no such rows yet (a case added to the harness since the last GPU run),
    print ``published`` instead: the published figure for the same measurement, with its source.
    """
    try:
        data = load(name)
    except ValueError:
        print(f"No GPU here, and no recording {name!r} in benchmarks/results/ yet: nothing to show.")
        return None
    if not rows(data, kernels):
        print(f"The recording {name!r} has no {kernels!r} rows yet: the next run of python -m benchmarks "
              "on a GPU records them.")
        if published:
            print(f"Published figure for the same measurement: {published}")
        return data
    print(caption(data))
    print(format_rows(rows(data, kernels)))
    if plot:
        plot_rows(data, kernels)
    return data


def plot_roofline(data: dict, chip: str | None = None, precision: str = "fp16"):
    """Every recorded row with an intensity, placed under ``chip``'s datasheet roof (log-log).

    ``chip`` is a :mod:`utils.gpu.hardware` name (``"H100-SXM"``); by default the header's ``spec``,
    else the H100 SXM. Memory-bound rows sit at ``GB/s x intensity``; compute-bound ones at their TFLOP/s.
    """
    import matplotlib.pyplot as plt

    g = hardware.spec(chip or data["header"].get("spec") or "H100-SXM")
    peak, bandwidth = g.flops(precision), g.hbm_bandwidth
    placed = [r for r in data["results"] if r.get("intensity")]
    xs = np.logspace(-2, 4, 300)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    ax.loglog(xs, [hardware.attainable_flops(x, peak, bandwidth) for x in xs], "k", lw=2,
              label=f"{g.name} roof: {peak / 1e12:.0f} TFLOP/s {precision}, {bandwidth / 1e12:.2f} TB/s")
    colors = plt.cm.tab20(np.linspace(0, 1, max(len(placed), 1)))
    for r, color in zip(placed, colors):
        flops = r["value"] * 1e12 if r["unit"] == "TFLOP/s" else r["value"] * 1e9 * r["intensity"]
        ax.scatter(r["intensity"], flops, color=color, s=40, zorder=3, label=f"{r['kernel']} ({r['shape']})")
    ax.set(xlabel="arithmetic intensity (FLOPs per byte of minimum HBM traffic)", ylabel="achieved FLOP/s")
    h = data["header"]
    ax.set_title(f"{h['device']}, {h['date_utc'][:10]}: every benchmarked kernel on the roofline", fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig
