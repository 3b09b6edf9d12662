"""Kernel-free widgets: a grid of precomputed frames behind sliders and menus (``viz.explore``).

A live widget (``viz.live``) needs a kernel. This module turns the *same* control
spec into a small grid of values, so that every frame can be drawn ahead of time
by the tested plot function and embedded as a PNG; a few lines of inline
JavaScript swap the image when a control moves. Nothing recomputes in the
browser: one source of truth.

Grid selection, in the order the controls are given (earlier controls win):

- ``(lo, hi)`` / ``(lo, hi, step)``: a slider reduced to at most ``slider_values``
  values on the step grid that include the default (geometric spacing when
  ``hi / lo >= 50``, else linear);
- a list, a tuple of ``(label, value)`` pairs or a dict: its options (a menu; a
  strictly increasing list of numbers becomes a slider over its values);
  a one-element list pins that value;
- a bool: ``[False, True]``;
- ``ipywidgets.fixed(v)``: pinned, silently, as in Jupyter;
- an ipywidgets object: ``IntSlider``/``FloatSlider``/``FloatLogSlider`` as a
  slider, ``Dropdown``-like objects as a menu, ``Checkbox`` as a bool, any other
  (``FloatText``, ``BoundedIntText``...) pinned at its value.

The default of a control is ``plot_fn``'s default when it lies on the control
(as ``ipywidgets.interactive`` does), else a slider's midpoint or a menu's first
option. If the product of the value counts exceeds ``budget``, the controls with
the most values are thinned first (to no fewer than three, the default always
kept); if that is not enough the last controls are held at their default, and
the widget says in one line which controls move on the page.
"""

from __future__ import annotations


import contextlib
import inspect
import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Callable, Iterator, Sequence

_EMPTY = inspect.Parameter.empty


@dataclass
class Control:
    """One control of the kernel-free widget: the values it offers and how it is drawn.

    ``kind`` is ``"range"`` (an ``<input type="range">``), ``"select"`` (a
    ``<select>``), ``"pinned"`` (held at its default by the frame budget or a
    one-value list: named in the widget's note) or ``"fixed"`` (``ipywidgets.fixed``
    or a text box: held silently). ``values[default_index]`` is the default.
    """

    name: str
    kind: str
    values: list
    labels: list[str]
    default_index: int

    @property
    def default(self) -> Any:
        return self.values[self.default_index]


def _label(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _index_of(values: Sequence, target: Any) -> int | None:
    for i, value in enumerate(values):
        if value is target:
            return i
    for i, value in enumerate(values):
        try:
            if _is_number(value) and _is_number(target):
                if math.isclose(value, target, rel_tol=1e-9, abs_tol=1e-12):
                    return i
            elif value == target:
                return i
        except Exception:  # values that do not compare (arrays) are simply not equal
            continue
    return None


def _thin(values: list, labels: list[str], default_index: int, count: int) -> tuple[list, list[str], int]:
    """``count`` of the options, evenly spread over them, always keeping the default."""
    if count >= len(values):
        return values, labels, default_index
    picks = {round(i * (len(values) - 1) / max(count - 1, 1)) for i in range(count)}
    if default_index not in picks:  # swap the pick nearest the default for the default
        picks.remove(min(picks, key=lambda i: (abs(i - default_index), -i)))
        picks.add(default_index)
    order = sorted(picks)
    return [values[i] for i in order], [labels[i] for i in order], order.index(default_index)


def _slider_values(name: str, lo: Real, hi: Real, step: Real, default: Any, count: int,
                   log_base: float | None = None) -> tuple[list, int]:
    """``count`` values of the slider ``lo..hi`` (on its step grid), the default among them."""
    if not (_is_number(lo) and _is_number(hi) and _is_number(step)):
        raise ValueError(f"control {name!r}: a slider needs numbers (lo, hi[, step]), got {(lo, hi, step)!r}")
    if not lo < hi or not step > 0:
        raise ValueError(f"control {name!r}: a slider needs lo < hi and step > 0, got lo={lo}, hi={hi}, step={step}")
    integer = all(isinstance(v, Integral) for v in (lo, hi, step)) and log_base is None
    n_steps = int(math.floor((hi - lo) / step + 1e-9))

    def snap(x: float) -> Any:
        tick = min(max(round((x - lo) / step), 0), n_steps)
        value = lo + tick * step
        return int(value) if integer else float(round(value, 12))

    if log_base is not None:  # lo, hi, step are exponents
        grid = [snap(lo + (hi - lo) * i / max(count - 1, 1)) for i in range(count)]
        values = sorted({float(log_base ** e) for e in grid})
        fallback = float(log_base ** snap(lo + (hi - lo) / 2))
        ok = _is_number(default) and default > 0 and log_base ** lo <= default <= log_base ** hi
        default = float(default) if ok else fallback
    else:
        if lo > 0 and hi / lo >= 50:
            raw = [lo * (hi / lo) ** (i / max(count - 1, 1)) for i in range(count)]
        else:
            raw = [lo + (hi - lo) * i / max(count - 1, 1) for i in range(count)]
        values = sorted({snap(x) for x in raw})
        ok = _is_number(default) and lo <= default <= hi
        default = (int(default) if integer and float(default).is_integer() else default) if ok else snap(lo + (hi - lo) / 2)
    if _index_of(values, default) is None:  # replace the nearest value by the default
        nearest = min(range(len(values)), key=lambda i: abs(values[i] - default))
        values[nearest] = default
        values = sorted(set(values))
    return values, _index_of(values, default)


def _options(name: str, spec: Any) -> tuple[list, list[str]]:
    if isinstance(spec, dict):
        items = list(spec.items())
    else:
        items = list(spec)
        pairs = all(isinstance(o, tuple) and len(o) == 2 and isinstance(o[0], str) for o in items)
        items = items if pairs and items else [(_label(o), o) for o in items]
    if not items:
        raise ValueError(f"control {name!r}: an empty list of options; give at least one value")
    return [v for _, v in items], [str(k) for k, _ in items]


def make_control(name: str, spec: Any, default: Any = _EMPTY, slider_values: int = 4) -> Control:
    """The :class:`Control` for one keyword of ``live``'s spec; ``default`` is ``plot_fn``'s default."""
    try:
        import ipywidgets
    except ImportError:  # the GPU machine has no Jupyter: only plain abbreviations there
        ipywidgets = None

    def from_options(values: list, labels: list[str], widget_default: Any = _EMPTY) -> Control:
        start = widget_default if widget_default is not _EMPTY else default
        index = _index_of(values, start) if start is not _EMPTY else None
        index = 0 if index is None else index
        numeric = all(_is_number(v) for v in values) and all(a < b for a, b in zip(values, values[1:]))
        kind = "pinned" if len(values) == 1 else ("range" if numeric and labels == [_label(v) for v in values]
                                                  else "select")
        return Control(name, kind, values, labels, index)

    def from_slider(lo, hi, step, start, log_base=None) -> Control:
        values, index = _slider_values(name, lo, hi, step, start, slider_values, log_base)
        return Control(name, "range", values, [_label(v) for v in values], index)

    if ipywidgets is not None and isinstance(spec, ipywidgets.fixed):
        return Control(name, "fixed", [spec.value], [_label(spec.value)], 0)
    if ipywidgets is not None and isinstance(spec, ipywidgets.Widget):
        if isinstance(spec, ipywidgets.FloatLogSlider):
            return from_slider(spec.min, spec.max, spec.step, spec.value, log_base=spec.base)
        if isinstance(spec, (ipywidgets.IntSlider, ipywidgets.FloatSlider)):
            return from_slider(spec.min, spec.max, spec.step, spec.value)
        if isinstance(spec, ipywidgets.Checkbox):
            return from_options([False, True], ["False", "True"], spec.value)
        if hasattr(spec, "_options_values"):
            return from_options(list(spec._options_values), list(spec._options_labels), spec.value)
        if hasattr(spec, "value"):
            return Control(name, "fixed", [spec.value], [_label(spec.value)], 0)
        raise ValueError(f"control {name!r}: {type(spec).__name__} is not a value widget")
    if isinstance(spec, bool):
        return from_options([False, True], ["False", "True"], spec)
    if isinstance(spec, tuple) and not all(isinstance(o, tuple) for o in spec):
        if len(spec) not in (2, 3):
            raise ValueError(f"control {name!r}: a slider is (lo, hi) or (lo, hi, step), got {spec!r}")
        lo, hi = spec[0], spec[1]
        integer = all(isinstance(v, Integral) and not isinstance(v, bool) for v in spec)
        step = spec[2] if len(spec) == 3 else (1 if integer else (hi - lo) / 100 if _is_number(hi) else 0)
        return from_slider(lo, hi, step, default)
    if isinstance(spec, (list, tuple, dict, range)):
        values, labels = _options(name, spec)
        return from_options(values, labels)
    raise ValueError(f"control {name!r}: {spec!r} is not a control; use (lo, hi), (lo, hi, step), a list, "
                     f"a dict, a bool, ipywidgets.fixed(v) or an ipywidgets value widget")


def _fit_counts(full: list[int], budget: int) -> list[int]:
    """How many values each control keeps: all controls if they fit, else the first ones that do.

    Counts are cut one at a time, the largest first (the later control on a tie),
    down to three (or fewer if a control has fewer); when that is not enough the
    last moving control is held, and the cutting starts again from full counts.
    """
    for m in range(len(full), 0, -1):
        counts = full[:m]
        floors = [min(3, c) for c in counts]
        while math.prod(counts) > budget:
            cuttable = [i for i in range(m) if counts[i] > floors[i]]
            if not cuttable:
                break
            i = max(cuttable, key=lambda j: (counts[j], j))
            counts[i] -= 1
        if math.prod(counts) <= budget:
            return counts + [1] * (len(full) - m)
    return [1] * len(full)


def select_grid(plot_fn: Callable, controls: dict[str, Any], budget: int = 24,
                slider_values: int = 4) -> list[Control]:
    """The controls of a kernel-free widget, thinned so the grid holds at most ``budget`` frames."""
    if not callable(plot_fn):
        raise ValueError(f"plot_fn must be callable, got {type(plot_fn).__name__}")
    if not isinstance(budget, Integral) or isinstance(budget, bool) or budget < 1:
        raise ValueError(f"budget must be a positive int (the most frames to draw), got {budget!r}")
    if not isinstance(slider_values, Integral) or isinstance(slider_values, bool) or slider_values < 2:
        raise ValueError(f"slider_values must be an int >= 2, got {slider_values!r}")
    signature = inspect.signature(plot_fn)
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    made = []
    for name, spec in controls.items():
        if name not in signature.parameters and not takes_kwargs:
            raise ValueError(f"control {name!r} is not a parameter of {getattr(plot_fn, '__name__', 'plot_fn')}; "
                             f"its parameters are {', '.join(signature.parameters)}")
        param = signature.parameters.get(name)
        made.append(make_control(name, spec, param.default if param is not None else _EMPTY, slider_values))
    moving = [c for c in made if c.kind in ("range", "select")]
    counts = dict(zip([c.name for c in moving], _fit_counts([len(c.values) for c in moving], budget)))
    result = []
    for control in made:
        if control.name in counts:
            if counts[control.name] < 2:
                control = Control(control.name, "pinned", [control.default],
                                  [control.labels[control.default_index]], 0)
            else:
                values, labels, index = _thin(control.values, control.labels, control.default_index,
                                              counts[control.name])
                control = Control(control.name, control.kind, values, labels, index)
        result.append(control)
    return result


def moving_note(controls: list[Control]) -> str:
    """One line naming what moves on the page, when the budget pinned some controls; else ``""``."""
    pinned = [c for c in controls if c.kind == "pinned"]
    if not pinned:
        return ""
    moving = [c.name for c in controls if c.kind in ("range", "select")]
    held = ", ".join(f"{c.name} = {c.labels[0]}" for c in pinned)
    total = len(moving) + len(pinned)
    return (f"On this page {', '.join(moving) or 'nothing'} can move, with {held}; "
            f"in Jupyter (viz.live) all {total} controls move.")


def frame_bbox(fig: Any, pad_inches: float = 0.1) -> Any:
    """The tight bounding box of ``fig`` (inches), padded: every frame of a widget is cut to the defaults' box.

    One box for all frames keeps the picture from jumping as a slider moves, and
    saves the second draw that ``bbox_inches="tight"`` costs on every frame.
    """
    return fig.get_tightbbox(fig.canvas.get_renderer()).padded(pad_inches)


@contextlib.contextmanager
def frame_dpi(dpi: int) -> Iterator[None]:
    """A context in which new figures are made at ``dpi`` (``rcParams["figure.dpi"]``).

    :func:`utils.viz.explore` calls the plot function inside it, so that the layout a plot
    function computes (``tight_layout``) and :func:`render_png`'s one draw use the same
    renderer and its text measurements; render a frame yourself inside it to get its bytes.

    The Agg renderers made inside it also share one math-text parser (see
    :func:`_shared_mathtext_parser`).
    """
    import matplotlib
    from matplotlib.backends import backend_agg

    make_parser = getattr(backend_agg, "MathTextParser", None)  # what RendererAgg.__init__ calls
    with matplotlib.rc_context({"figure.dpi": dpi}):
        if make_parser is None or make_parser is _shared_parser_of_type:
            yield
            return
        backend_agg.MathTextParser = _shared_parser_of_type
        try:
            yield
        finally:
            backend_agg.MathTextParser = make_parser


_SHARED_MATHTEXT_PARSERS: dict[str, Any] = {}


def _shared_mathtext_parser(parser: Any) -> Any:
    """The first math-text parser seen of ``parser``'s output type, which frames share.

    Matplotlib caches parsed math text (the ``10^n`` labels of every log axis) per parser,
    and every new figure gets a new renderer with a parser of its own: the frames of a
    widget, all new figures, would parse the same labels again and again.
    """
    return _SHARED_MATHTEXT_PARSERS.setdefault(getattr(parser, "_output_type", type(parser).__name__), parser)


def _shared_parser_of_type(output: str) -> Any:
    """``MathTextParser(output)``, shared: the stand-in :func:`frame_dpi` gives Matplotlib's Agg backend."""
    from matplotlib.mathtext import MathTextParser

    return _shared_mathtext_parser(MathTextParser(output))


def render_png(fig: Any, dpi: int, colors: int = 64, bbox: Any = None) -> bytes:
    """``fig`` as a small PNG: drawn once at ``dpi``, cut to ``bbox`` (tight if ``None``), quantized to ``colors``.

    The figure is drawn on the Agg canvas on a white face and the box (inches) is cut from
    its pixels, as ``savefig(dpi=dpi, bbox_inches=bbox, facecolor="white")`` would, without
    savefig's extra layout draw and its PNG round trip; a box that reaches past the figure
    is filled with white. The frames of :func:`utils.viz.explore` are exactly these bytes (of
    figures made inside :func:`frame_dpi`), so a test can render ``plot_fn(**values)`` itself
    and compare.
    """
    import io

    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    face = fig.get_facecolor()
    if fig.dpi != dpi:
        fig.set_dpi(dpi)
    fig.set_facecolor("white")
    try:
        renderer = canvas.get_renderer()
        renderer.mathtext_parser = _shared_mathtext_parser(renderer.mathtext_parser)
        canvas.draw()
        pixels = np.asarray(canvas.buffer_rgba())[..., :3]
        if bbox is None:
            bbox = frame_bbox(fig)
    finally:
        fig.set_facecolor(face)
    height, width = pixels.shape[:2]
    left, right = round(bbox.x0 * dpi), round(bbox.x1 * dpi)
    top, bottom = round(height - bbox.y1 * dpi), round(height - bbox.y0 * dpi)
    frame = np.full((max(1, bottom - top), max(1, right - left), 3), 255, dtype=np.uint8)
    src_top, src_left = max(top, 0), max(left, 0)
    src_bottom, src_right = min(bottom, height), min(right, width)
    if src_bottom > src_top and src_right > src_left:
        frame[src_top - top:src_bottom - top, src_left - left:src_right - left] = \
            pixels[src_top:src_bottom, src_left:src_right]
    out = io.BytesIO()
    Image.fromarray(frame, "RGB").quantize(colors=colors, method=Image.Quantize.FASTOCTREE,
                                           dither=Image.Dither.NONE).save(out, format="PNG", optimize=True)
    return out.getvalue()


def grid_points(controls: list[Control]) -> list[dict[str, Any]]:
    """Every combination of the moving controls' values (the first control varies slowest)."""
    points: list[dict[str, Any]] = [{}]
    for control in controls:
        values = control.values if control.kind in ("range", "select") else [control.default]
        points = [{**p, control.name: v} for p in points for v in values]
    return points


_WIDGETS_MADE = 0


def render_html(controls: list[Control], frames: list[bytes], order: list[int], title: str) -> str:
    """The widget: ``<div class="viz-explore">`` with one control per moving control and one ``<img>``.

    ``frames`` are the distinct PNGs; ``order[i]`` is the frame of grid point ``i``
    (in :func:`grid_points`'s order). The inline script needs no library and no network.
    """
    import base64
    import hashlib
    import html
    import json

    global _WIDGETS_MADE
    _WIDGETS_MADE += 1
    digest = hashlib.sha1(b"".join(frames)).hexdigest()[:8]
    uid = f"viz-explore-{digest}-{_WIDGETS_MADE}"
    moving = [c for c in controls if c.kind in ("range", "select")]
    uris = ["data:image/png;base64," + base64.b64encode(f).decode("ascii") for f in frames]
    start = 0
    for control in moving:
        start = start * len(control.values) + control.default_index
    parts = [f'<div class="viz-explore" id="{uid}" data-frames="{len(order)}">',
             '<div class="viz-explore-controls" style="display:flex;flex-wrap:wrap;gap:0.2em 1.5em;'
             'font-family:sans-serif;font-size:0.9em">']
    for k, control in enumerate(moving):
        name = html.escape(control.name)
        if control.kind == "range":
            parts.append(f'<label>{name} <input type="range" id="{uid}-c{k}" data-control="{name}" min="0" '
                         f'max="{len(control.values) - 1}" step="1" value="{control.default_index}" '
                         f'style="vertical-align:middle"> <output>{html.escape(control.labels[control.default_index])}'
                         f'</output></label>')
        else:
            options = "".join(f'<option value="{i}"{" selected" if i == control.default_index else ""}>'
                              f'{html.escape(label)}</option>' for i, label in enumerate(control.labels))
            parts.append(f'<label>{name} <select id="{uid}-c{k}" data-control="{name}">{options}</select></label>')
    parts.append("</div>")
    parts.append(f'<img class="viz-explore-frame" id="{uid}-img" src="{uris[order[start]]}" '
                 f'alt="{html.escape(title)}" style="max-width:100%">')
    note = moving_note(controls)
    if note:
        parts.append(f'<p class="viz-explore-note" style="font-size:0.85em;margin:0">{html.escape(note)}</p>')
    labels = json.dumps([c.labels for c in moving]).replace("</", "<\\/")
    parts.append(
        "<script>(function(){"
        f'var root=document.getElementById("{uid}");'
        f"var F={json.dumps(uris)},O={json.dumps(order)},L={labels};"
        'var cs=root.querySelectorAll("[data-control]"),img=root.querySelector("img.viz-explore-frame");'
        "function show(){var i=0;for(var k=0;k<cs.length;k++){var v=+cs[k].value;i=i*L[k].length+v;"
        'var o=cs[k].nextElementSibling;if(o&&o.tagName==="OUTPUT"){o.textContent=L[k][v];}}img.src=F[O[i]];}'
        'for(var k=0;k<cs.length;k++){cs[k].addEventListener("input",show);cs[k].addEventListener("change",show);}'
        "})();</script>")
    parts.append("</div>")
    return "\n".join(parts)
