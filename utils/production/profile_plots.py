"""Where a profiled step's time goes: self times grouped into the classes a verdict needs, and their figure.

:func:`breakdown` sums the self times of a trace (:func:`utils.production.trace_timeline.self_times`)
into :data:`CLASSES`: matrix multiplications, element-wise and reduction operators, copies and views,
collectives, and the rest. The ``record_function`` ranges (``forward``, ...) and the profiler's own
spans are left out: their self time is Python and framework time between operators, which
:func:`breakdown` reports apart as ``between operators``. :func:`plot_step_breakdown` profiles the
tiny LLaMA step at a batch size and draws the breakdown, for the chapter's widget.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from utils.production import profiled_step, trace_timeline
from utils.production.trace_timeline import TraceEvent

CLASSES = ("matmul", "element-wise", "copies and views", "collectives", "other operators", "between operators")
"""The classes of :func:`breakdown`, in the order the figure stacks them."""

_MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
           "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention"}
_COPIES = {"aten::copy_", "aten::view", "aten::reshape", "aten::transpose", "aten::t", "aten::contiguous",
           "aten::expand", "aten::cat", "aten::clone", "aten::_unsafe_view", "aten::as_strided", "aten::permute",
           "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::view_as_real",
           "aten::view_as_complex", "aten::empty", "aten::empty_like", "aten::zeros", "aten::zeros_like",
           "aten::resize_", "aten::detach", "detach", "aten::to", "aten::_to_copy", "aten::empty_strided",
           "aten::stack", "aten::split", "aten::chunk", "aten::flatten", "aten::unflatten", "aten::repeat_interleave"}
_ELEMENTWISE_WORDS = ("add", "mul", "div", "sub", "exp", "log", "sqrt", "rsqrt", "pow", "neg", "silu", "sigmoid",
                      "relu", "gelu", "tanh", "softmax", "mean", "sum", "max", "min", "norm", "where", "fill",
                      "lerp", "addcmul", "addcdiv", "sign", "abs", "clamp", "cos", "sin", "embedding", "nll",
                      "cross_entropy", "masked", "triu", "tril", "gather", "scatter", "index", "sort", "amax")


def classify(name: str) -> str:
    """The class of an event name (one of :data:`CLASSES`), or ``""`` for a range that is not an operator."""
    if trace_timeline.is_collective(name):
        return "collectives"
    if not (name.startswith("aten::") or name.startswith("c10d::")):
        return ""
    if name in _MATMUL or name.endswith("_backward") and any(m in name for m in ("mm", "linear")):
        return "matmul"
    if name in _COPIES:
        return "copies and views"
    op = name.split("::", 1)[1].lstrip("_")
    if any(word in op for word in _ELEMENTWISE_WORDS):
        return "element-wise"
    return "other operators"


def breakdown(events: Sequence[TraceEvent], steps: int = 1) -> dict[str, float]:
    """Milliseconds per step in each class of :data:`CLASSES`, from the events' self times.

    ``between operators`` is the self time of everything that is not an
    operator (``record_function`` ranges, autograd nodes, Python): time the step
    spends on the CPU outside any operator's own work.
    """
    if steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    out = dict.fromkeys(CLASSES, 0.0)
    for name, (self_us, _) in trace_timeline.self_times(events).items():
        if name.startswith("PyTorch Profiler") or name.startswith("ProfilerStep"):
            continue
        out[classify(name) or "between operators"] += self_us / 1000 / steps
    return out


def operators_per_step(events: Sequence[TraceEvent], steps: int = 1) -> float:
    """Operator calls (``aten::`` events, nested ones included) per step."""
    return sum(e.name.startswith("aten::") for e in events) / steps


_COLOURS = {"matmul": "#55a868", "element-wise": "#dd8452", "copies and views": "#c4ad66", "collectives": "#8172b3",
            "other operators": "#b0b0b0", "between operators": "#4c72b0"}


def plot_breakdown(parts: Mapping[str, float], title: str = "", ax=None) -> Figure:
    """A horizontal stacked bar of milliseconds per class, labelled with each class's share."""
    fig, ax = (plt.subplots(figsize=(8, 2.0)) if ax is None else (ax.figure, ax))
    total, left = sum(parts.values()), 0.0
    for name in CLASSES:
        value = parts.get(name, 0.0)
        if value <= 0:
            continue
        ax.barh(0, value, left=left, color=_COLOURS[name], edgecolor="white",
                label=f"{name} ({value / total:.0%})")
        left += value
    ax.set(yticks=[], xlabel="milliseconds per training step (self time)", xlim=(0, total * 1.02), title=title)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    return fig


def plot_step_breakdown(batch: int = 8) -> Figure:
    """Profile the tiny LLaMA step at ``batch`` sequences of 64 tokens and draw where its time goes."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "step.json"
        profiled_step.profile_step(path, batch=batch, seq_len=64, wait=1, warmup=1, active=1, record_shapes=False)
        events = trace_timeline.read_chrome_trace(path)
    parts = breakdown(events)
    return plot_breakdown(parts, title=f"batch {batch}: {sum(parts.values()):.1f} ms, "
                                       f"{operators_per_step(events):.0f} operator calls")
