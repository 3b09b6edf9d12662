"""The book's widget pattern: a pure plot function, a static figure, live controls, frames, an animation.

Every figure of the book is drawn by a *pure* function of its parameters that
returns a Matplotlib figure. A page then uses it four ways:

1. ``plot_fn(**defaults)``: the static figure the HTML book shows;
2. :func:`live` ``(plot_fn, n=(1, 64), ...)``: sliders for a reader in Jupyter
   (an ``ipywidgets.interactive``; it needs a running kernel, so the cell carries
   the tags ``nbval-ignore-output``, ``remove-output`` and ``skip-execution``:
   the book build does not run it, see the README);
3. :func:`explore` ``(plot_fn, n=(1, 64), ...)``: the same controls for a reader
   of the HTML book, with no kernel and no network: the plot function draws a
   small grid of frames ahead of time (at most ``budget``), embedded as PNGs
   behind ``<input type="range">`` and ``<select>`` controls wired by a few
   lines of inline JavaScript (grid rules in :mod:`utils.explore`). The cell
   runs in the book build, so the figure a reader scrubs is the tested
   function's own output;
4. :func:`animate` ``(draw_step, n_steps)``: a step-by-step algorithm as a
   scrubbable animation (``FuncAnimation.to_jshtml``) that plays in the static
   HTML with no kernel.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import matplotlib

matplotlib.rcParams.update({"figure.dpi": 80, "savefig.dpi": 80, "figure.figsize": (6.4, 3.6),
                            "animation.embed_limit": 8.0})

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.animation import FuncAnimation  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from utils.validate import check_positive_int  # noqa: E402

PlotFn = Callable[..., Figure]


def live(plot_fn: PlotFn, **controls: Any) -> Any:
    """``plot_fn`` with one ipywidgets control per keyword, as an ``interactive`` widget.

    Leave the call as a cell's last expression to show it.
    ``controls`` follow ``ipywidgets.interact``'s abbreviations: ``(lo, hi)`` or
    ``(lo, hi, step)`` gives a slider, a list gives a dropdown, a bool a
    checkbox, ``ipywidgets.fixed(v)`` pins a value.
    """
    if not callable(plot_fn):
        raise ValueError(f"plot_fn must be callable, got {type(plot_fn).__name__}")
    import ipywidgets

    @functools.wraps(plot_fn)  # keeps plot_fn's signature, so sliders start at its defaults
    def draw(**kwargs: Any) -> None:
        fig = plot_fn(**kwargs)
        if not isinstance(fig, Figure):
            raise ValueError(f"{getattr(plot_fn, '__name__', 'plot_fn')} must return a matplotlib Figure, "
                             f"got {type(fig).__name__}")
        plt.show()

    return ipywidgets.interactive(draw, **controls)


def explore(plot_fn: PlotFn, budget: int = 24, dpi: int = 56, slider_values: int = 4, colors: int = 64,
            **controls: Any) -> Any:
    """``plot_fn`` behind kernel-free controls: a grid of precomputed frames, as HTML.

    ``controls`` take :func:`live`'s spec (``(lo, hi)``, ``(lo, hi, step)``, lists,
    dicts, bools, ``ipywidgets.fixed(v)``, ipywidgets slider/text objects); give a
    list instead of a slider to choose the values a page offers, a one-element
    list to hold a control. At most ``budget`` frames are drawn: controls are
    thinned, in the order given, and those that do not fit are held at their
    default (the widget says which). Each frame is ``plot_fn(**values)`` saved
    made at ``dpi`` (:func:`utils.explore.frame_dpi`) and drawn once by
    :func:`utils.explore.render_png` with a ``colors``-colour
    palette, cut to the box of the defaults' frame (:func:`utils.explore.frame_bbox`).
    A combination ``plot_fn`` refuses with ``ValueError`` gets a frame that shows
    the message (the defaults must draw). Returns an ``IPython.display.HTML``;
    leave it as a cell's last expression. The root is ``<div class="viz-explore" data-frames="N">``, each
    control carries ``data-control="<name>"``, the figure is its one
    ``<img class="viz-explore-frame">``.
    """
    from utils.explore import frame_bbox, frame_dpi, grid_points, render_html, render_png, select_grid

    check_positive_int("dpi", dpi)
    check_positive_int("colors", colors)
    if colors > 256:
        raise ValueError(f"colors must be at most 256 (a PNG palette), got {colors}")
    grid = select_grid(plot_fn, controls, budget=budget, slider_values=slider_values)
    name = getattr(plot_fn, "__name__", "plot_fn")
    points = grid_points(grid)
    first = points.index({c.name: c.default for c in grid})  # the defaults' frame sets the box of all
    with frame_dpi(dpi):
        fig = _draw(plot_fn, name, points[first])
    size, bbox = tuple(fig.get_size_inches()), frame_bbox(fig)
    pngs: list[bytes] = [b""] * len(points)
    for index in [first] + [i for i in range(len(points)) if i != first]:
        if index != first:
            try:
                with frame_dpi(dpi):
                    fig = _draw(plot_fn, name, points[index])
            except ValueError as error:  # an invalid combination: the frame shows the function's own message
                with frame_dpi(dpi):
                    fig = _message_figure(f"{name}: {error}")
        pngs[index] = render_png(fig, dpi, colors, bbox if tuple(fig.get_size_inches()) == size else None)
        plt.close(fig)
    frames: list[bytes] = []
    seen: dict[bytes, int] = {}
    order: list[int] = []
    for png in pngs:
        if png not in seen:
            seen[png] = len(frames)
            frames.append(png)
        order.append(seen[png])
    from IPython.display import HTML

    return HTML(render_html(grid, frames, order, title=name))


def _draw(plot_fn: PlotFn, name: str, values: dict[str, Any]) -> Figure:
    fig = plot_fn(**values)
    if not isinstance(fig, Figure):
        plt.close("all")
        raise ValueError(f"{name} must return a matplotlib Figure, got {type(fig).__name__}")
    return fig


def _message_figure(message: str) -> Figure:
    """A small figure that shows ``message``: the frame of a combination ``plot_fn`` refuses."""
    import textwrap

    fig, ax = plt.subplots(figsize=(6.4, 1.2))
    ax.axis("off")
    ax.text(0.5, 0.5, textwrap.fill(message, 90), ha="center", va="center", color="firebrick", fontsize=9)
    return fig


def animate(
    draw_step: Callable[[Any, int], None],
    n_steps: int,
    figsize: tuple[float, float] = (6.4, 3.2),
    interval_ms: int = 800,
    dpi: int = 72,
    *,
    alt: str | Sequence[str] | Callable[[int], str] | None = None,
    label: str = "Animation frame",
) -> Any:
    """A scrubbable animation of ``n_steps`` steps, as HTML that plays without a kernel.

    ``draw_step(ax, step)`` draws step ``step`` (0-based) on a cleared axes.
    Returns an ``IPython.display.HTML`` object; leave it as a cell's last
    expression to show it. Keep ``n_steps`` and ``dpi`` small: each frame is an
    embedded PNG.

    The frame image carries an ``alt`` text that follows the frame shown, and the
    slider a ``<label>`` (``label``), for a reader with a screen reader (WCAG
    1.1.1, 4.1.2). ``alt`` is one text for every frame, a sequence of one text
    per frame, or a function of the step; by default a frame's text is
    ``"{label} {step + 1} of {n_steps}"`` followed by the title the frame drew.
    """
    if not callable(draw_step):
        raise ValueError(f"draw_step must be callable, got {type(draw_step).__name__}")
    check_positive_int("n_steps", n_steps)
    if n_steps > 200:
        raise ValueError(f"n_steps={n_steps} would embed too many frames; use at most 200")
    if not isinstance(label, str) or not label.strip():
        raise ValueError(f"label must be a non-empty string (it names the slider), got {label!r}")
    if not (alt is None or isinstance(alt, str) or callable(alt)):
        alt = list(alt)
        if len(alt) != n_steps or not all(isinstance(a, str) for a in alt):
            raise ValueError(f"alt must give one string per frame ({n_steps}), got {len(alt)} items")
    from IPython.display import HTML

    fig, ax = plt.subplots(figsize=figsize, dpi=dpi)
    titles: dict[int, str] = {}

    def update(step: int) -> list:
        ax.clear()
        draw_step(ax, step)
        suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
        titles[step] = " ".join(t for t in (suptitle, ax.get_title()) if t)
        return []

    animation = FuncAnimation(fig, update, frames=n_steps, interval=interval_ms, blit=False)
    with matplotlib.rc_context({"savefig.dpi": dpi}):  # frames are saved at savefig.dpi
        html = animation.to_jshtml(default_mode="once")
    plt.close(fig)
    if isinstance(alt, str):
        alts = [alt] * n_steps
    elif callable(alt):
        alts = [str(alt(step)) for step in range(n_steps)]
    elif alt is not None:
        alts = alt
    else:
        alts = [f"{label} {step + 1} of {n_steps}" + (f": {titles[step]}" if titles.get(step) else "")
                for step in range(n_steps)]
    return HTML(_with_frame_alts(html, alts, label))


def _with_frame_alts(jshtml: str, alts: list[str], slider_label: str) -> str:
    """A ``to_jshtml`` animation whose image shows ``alts[frame]`` as its ``alt`` and whose slider has a label.

    Matplotlib's player swaps the image's ``src`` in ``set_frame``; a few lines of script wrap it to
    swap the ``alt`` too.
    """
    import html
    import json
    import re

    match = re.search(r'<img id="_anim_img(\w+)"', jshtml)
    if match is None:
        raise ValueError("not a to_jshtml animation: no <img id=\"_anim_img...\"> found")
    anim_id = match.group(1)
    out = jshtml.replace(match.group(0), f'{match.group(0)} alt="{html.escape(alts[0], quote=True)}"', 1)
    slider = f'<input id="_anim_slider{anim_id}"'
    out = out.replace(slider, f'<label for="_anim_slider{anim_id}">{html.escape(slider_label)}</label>\n'
                              f'    {slider}', 1)
    script = f"""
<script language="javascript">
  (function() {{
    var alts = {json.dumps(alts)};
    setTimeout(function() {{
      var anim = window["anim{anim_id}"];
      if (!anim) {{ return; }}
      var set_frame = anim.set_frame.bind(anim);
      anim.set_frame = function(frame) {{
        set_frame(frame);
        document.getElementById("_anim_img{anim_id}").alt = alts[frame];
      }};
      anim.set_frame(anim.current_frame);
    }}, 0);
  }})()
</script>
"""
    return out + script
