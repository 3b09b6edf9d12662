"""Read a profiler trace and draw it as a timeline that needs no kernel: lanes of nested bars, one tooltip per bar.

``torch.profiler`` exports the Chrome trace-event format (``prof.export_chrome_trace``),
which Perfetto and ``chrome://tracing`` read: a JSON object whose ``traceEvents``
holds *complete* events (``"ph": "X"``) with a name, a category, a start ``ts``
and a duration ``dur`` in microseconds, on a process ``pid`` and thread
``tid``, plus *metadata* events (``"ph": "M"``) that name them (Google, "Trace
Event Format", 2016). PyTorch's traces add ``baseTimeNanoseconds``: the
``ts`` values count from it, so traces written by different ranks on one
machine share a clock once it is added back (:func:`read_chrome_trace`).

Events on one thread nest (``forward`` contains ``aten::linear`` contains
``aten::addmm``); their *depth* is how many enclosing events each has, and an
event's *self time* is its duration less that of its direct children
(:func:`self_times`), the column ``torch.profiler``'s ``key_averages`` calls
"Self CPU". :func:`timeline_html` draws the events as an SVG (lanes
top to bottom, depth within a lane, a ``<title>`` tooltip on every bar), so a
trace shows in the static HTML book as it does in Jupyter.
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from utils.validate import check_positive, check_positive_int


class TraceEvent(NamedTuple):
    """One complete event: its lane (process and thread, or a rank's name), times in microseconds, nesting depth."""

    lane: str
    name: str
    category: str
    start_us: float
    duration_us: float
    depth: int
    args: Mapping[str, Any]

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us


CATEGORY_COLOURS = {
    "user_annotation": "#4c72b0",      # record_function ranges: forward, backward, optimizer
    "gpu_user_annotation": "#4c72b0",
    "cpu_op": "#dd8452",               # aten operators
    "python_function": "#8c8c8c",
    "kernel": "#55a868",               # GPU kernels
    "gpu_memcpy": "#c44e52",
    "gpu_memset": "#c44e52",
    "cuda_runtime": "#937860",
    "communication": "#8172b3",        # collectives: NCCL kernels, gloo and c10d ops
}
"""Bar colours by category; an event whose name names a collective is drawn as ``communication``."""

_COLLECTIVE_WORDS = ("allreduce", "all_reduce", "allgather", "all_gather", "reduce_scatter", "broadcast", "alltoall",
                     "all_to_all", "nccl", "gloo", "c10d::")


def is_collective(name: str) -> bool:
    """Whether an event's name names a collective (NCCL kernels, gloo and ``c10d`` operators, ``record_param_comms``)."""
    lowered = name.lower()
    return any(word in lowered for word in _COLLECTIVE_WORDS) or lowered == "record_param_comms"


def read_chrome_trace(trace: str | Path | Mapping[str, Any], lane_prefix: str = "",
                      keep_profiler_spans: bool = False) -> list[TraceEvent]:
    """The complete events of a Chrome trace (a path, or the loaded JSON), sorted by lane and start, with depths.

    Lanes are named from the trace's ``thread_name`` metadata (``"thread 15030
    (python)"``), after its ``process_name`` when the trace has several
    processes, and prefixed by ``lane_prefix`` (a rank's name, when traces of
    several ranks are shown together). Times are absolute: ``ts`` plus
    ``baseTimeNanoseconds / 1000`` when the trace has it. The profiler's own
    span (category ``"Trace"``, ``"PyTorch Profiler (0)"``) is left out unless
    ``keep_profiler_spans``.
    """
    data = _load(trace)
    events = data.get("traceEvents")
    if not isinstance(events, list):
        raise ValueError("a Chrome trace is a JSON object with a 'traceEvents' list (torch.profiler's "
                         "export_chrome_trace writes one)")
    base_us = float(data.get("baseTimeNanoseconds", 0)) / 1000
    process, thread = {}, {}
    for e in events:
        if e.get("ph") == "M" and isinstance(e.get("args"), Mapping):
            if e.get("name") == "process_name":
                process[e.get("pid")] = str(e["args"].get("name", e.get("pid")))
            elif e.get("name") == "thread_name":
                thread[(e.get("pid"), e.get("tid"))] = str(e["args"].get("name", e.get("tid")))
    complete = [e for e in events if e.get("ph") == "X" and (keep_profiler_spans or e.get("cat") != "Trace")]
    several = len({e.get("pid") for e in complete}) > 1
    raw = []
    for e in complete:
        duration = float(e.get("dur", 0))
        if duration < 0:
            raise ValueError(f"event {e.get('name')!r} has a negative duration ({duration} us)")
        pid, tid = e.get("pid"), e.get("tid")
        lane = thread.get((pid, tid), f"thread {tid}")
        if several:
            lane = f"{process.get(pid, f'process {pid}')} / {lane}"
        raw.append((lane_prefix + lane, str(e.get("name", "?")), str(e.get("cat", "")), base_us + float(e["ts"]),
                    duration, MappingProxyType(dict(e.get("args", {})))))
    return _with_depths(raw)


def _load(trace: str | Path | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(trace, Mapping):
        return trace
    if isinstance(trace, (str, Path)):
        with open(trace) as f:
            return json.load(f)
    raise ValueError(f"trace must be a path to a Chrome trace JSON file or its loaded dict, got {type(trace).__name__}")


def _with_depths(raw: Iterable[tuple]) -> list[TraceEvent]:
    """Sort by lane, start, and longest first, then give each event the number of open events enclosing it."""
    out: list[TraceEvent] = []
    ordered = sorted(raw, key=lambda r: (r[0], r[3], -r[4]))
    stack: list[tuple[str, float]] = []  # (lane, end) of the enclosing events
    for lane, name, category, start, duration, args in ordered:
        while stack and (stack[-1][0] != lane or stack[-1][1] <= start):
            stack.pop()
        out.append(TraceEvent(lane, name, category, start, duration, len(stack), args))
        stack.append((lane, start + duration))
    return out


def merge(traces: Mapping[str, Sequence[TraceEvent]]) -> list[TraceEvent]:
    """The events of several traces (``{"rank 0": events, ...}``) on one timeline, each lane prefixed by its key."""
    if not traces:
        raise ValueError("merge needs at least one trace, as {name: events}")
    raw = [(f"{name}: {e.lane}", e.name, e.category, e.start_us, e.duration_us, e.args)
           for name, events in traces.items() for e in events]
    return _with_depths(raw)


def self_times(events: Sequence[TraceEvent]) -> dict[str, tuple[float, int]]:
    """Per name, largest first: total self time in microseconds (duration less its direct children's) and calls.

    The same accounting as ``torch.profiler``'s "Self CPU" column, taken from
    the trace. ``events`` in :func:`read_chrome_trace`'s order (by lane, then start).
    """
    children = [0.0] * len(events)
    open_: list[int] = []  # indices of the events enclosing the current one
    for i, e in enumerate(events):
        while open_ and (events[open_[-1]].lane != e.lane or events[open_[-1]].end_us <= e.start_us):
            open_.pop()
        if open_:
            children[open_[-1]] += e.duration_us
        open_.append(i)
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e, inner in zip(events, children):
        totals[e.name][0] += e.duration_us - inner
        totals[e.name][1] += 1
    return {name: (t, int(n)) for name, (t, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])}


def lane_busy_us(events: Sequence[TraceEvent], depth: int = 0) -> dict[str, float]:
    """Per lane, the microseconds covered by its events at ``depth`` (0: the outermost ranges)."""
    busy: dict[str, float] = defaultdict(float)
    for e in events:
        if e.depth == depth:
            busy[e.lane] += e.duration_us
    return dict(busy)


def _colour(e: TraceEvent) -> str:
    if is_collective(e.name):
        return CATEGORY_COLOURS["communication"]
    return CATEGORY_COLOURS.get(e.category, "#b0b0b0")


def _ticks(span_us: float) -> float:
    """The smallest step of 1, 2 or 5 times a power of ten that cuts ``span_us`` into at most 8 intervals."""
    step = 1e-3
    while span_us / step > 8:
        for factor in (2, 2.5, 2):  # 1 -> 2 -> 5 -> 10
            step *= factor
            if span_us / step <= 8:
                break
    return step


def timeline_html(events: Sequence[TraceEvent], title: str = "Trace timeline", width: int = 880,
                  row_height: int = 14, max_depth: int = 4, label_width: int = 210,
                  start_us: float | None = None, end_us: float | None = None) -> str:
    """An SVG timeline of ``events``: one lane per row group, nested events below their parents, a tooltip per bar.

    Times are shown from the first event drawn (``start_us``, default the
    earliest), in milliseconds. Events deeper than ``max_depth`` or outside
    ``[start_us, end_us]`` are left out; the caption says how many. Every bar
    carries a ``<title>`` (name, category, duration), which browsers show on
    hover, and the figure a ``role="img"`` and an ``aria-label`` for screen readers.
    """
    check_positive_int("width", width)
    check_positive_int("row_height", row_height)
    check_positive_int("max_depth + 1", max_depth + 1)
    if not events:
        raise ValueError("no events to draw: read a trace with read_chrome_trace first")
    t0 = min(e.start_us for e in events) if start_us is None else float(start_us)
    t1 = max(e.end_us for e in events) if end_us is None else float(end_us)
    check_positive("end_us - start_us", t1 - t0, finite=True)
    shown = [e for e in events if e.depth <= max_depth and e.end_us > t0 and e.start_us < t1]
    if not shown:
        raise ValueError(f"no event between {t0} and {t1} us at depth <= {max_depth}")
    lanes = list(dict.fromkeys(e.lane for e in shown))
    depth_of = {lane: max(e.depth for e in shown if e.lane == lane) + 1 for lane in lanes}
    top, axis = 24, 18
    plot_w = width - label_width - 10
    y_of, y = {}, top
    for lane in lanes:
        y_of[lane] = y
        y += depth_of[lane] * row_height + 6
    height = y + axis
    scale = plot_w / (t1 - t0)
    parts = [f'<svg class="trace-timeline" xmlns="http://www.w3.org/2000/svg" width="100%" '
             f'style="max-width:{width}px;height:auto;font-family:sans-serif;font-size:11px" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}: {len(shown)} events on '
             f'{len(lanes)} lanes over {(t1 - t0) / 1000:.3g} ms">',
             f'<text x="4" y="14" font-weight="bold">{html.escape(title)}</text>']
    for lane in lanes:
        parts.append(f'<text x="4" y="{y_of[lane] + row_height - 3}">{html.escape(_short(lane, 34))}</text>')
        parts.append(f'<line x1="{label_width}" x2="{width - 10}" y1="{y_of[lane] - 3}" y2="{y_of[lane] - 3}" '
                     'stroke="#dddddd"/>')
    for e in shown:
        x = label_width + max(e.start_us - t0, 0) * scale
        w = max((min(e.end_us, t1) - max(e.start_us, t0)) * scale, 0.5)
        ey = y_of[e.lane] + e.depth * row_height
        tip = f"{e.name} ({e.category or 'event'}): {e.duration_us:,.1f} us, from {(e.start_us - t0) / 1000:.3f} ms"
        parts.append(f'<rect x="{x:.2f}" y="{ey}" width="{w:.2f}" height="{row_height - 2}" fill="{_colour(e)}" '
                     f'stroke="white" stroke-width="0.3"><title>{html.escape(tip)}</title></rect>')
        if w > 7 * min(len(e.name), 30):
            parts.append(f'<text x="{x + 2:.2f}" y="{ey + row_height - 4}" fill="white" pointer-events="none">'
                         f'{html.escape(_short(e.name, 30))}</text>')
    step = _ticks(t1 - t0)
    tick, axis_y = 0.0, height - axis + 4
    while tick <= t1 - t0 + 1e-9:
        x = label_width + tick * scale
        parts.append(f'<line x1="{x:.2f}" x2="{x:.2f}" y1="{top - 4}" y2="{axis_y}" stroke="#eeeeee"/>')
        parts.append(f'<text x="{x:.2f}" y="{axis_y + 11}" text-anchor="middle">{tick / 1000:g} ms</text>')
        tick += step
    parts.append("</svg>")
    left_out = len(events) - len(shown)
    caption = (f"{len(shown)} events on {len(lanes)} lanes; hover a bar for its name and duration"
               + (f"; {left_out} deeper or outside the window left out" if left_out else ""))
    return f'<figure style="margin:0">{"".join(parts)}<figcaption style="font-size:11px">{caption}</figcaption></figure>'


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def show_timeline(events: Sequence[TraceEvent], **kwargs: Any) -> Any:
    """:func:`timeline_html` as an ``IPython.display.HTML`` object: the output a notebook cell stores and the book shows."""
    from IPython.display import HTML
    return HTML(timeline_html(events, **kwargs))
