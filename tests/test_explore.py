"""Kernel-free widgets (viz.explore, utils/explore.py): grid selection, the HTML contract, one source of truth."""

import base64
import json
import math
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from utils import viz  # noqa: E402
from utils.explore import frame_bbox, frame_dpi, grid_points, moving_note, render_png, select_grid  # noqa: E402

pytest.importorskip("IPython", reason="a machine without Jupyter (the GPU machine)")
ipywidgets = pytest.importorskip("ipywidgets", reason="a machine without Jupyter (the GPU machine)")


def _bars(n=4, scale=2.0, colour="C0", sorted_=True, pinned=1.0):
    fig, ax = plt.subplots(figsize=(3, 2))
    heights = [scale * (i + 1) * pinned for i in range(n)]
    ax.bar(range(n), heights if sorted_ else heights[::-1], color=colour)
    ax.set_ylim(0, 200)
    return fig


def _by_name(controls):
    return {c.name: c for c in controls}


def test_sliders_are_reduced_to_a_few_values_that_include_the_default():
    grid = _by_name(select_grid(_bars, {"n": (1, 64), "scale": (0.5, 9.5, 0.5)}, budget=1000, slider_values=5))
    assert grid["n"].kind == "range" and len(grid["n"].values) == 5
    assert grid["n"].default == 4 and grid["n"].values[0] == 1 and grid["n"].values[-1] == 64
    assert all(isinstance(v, int) for v in grid["n"].values)
    assert grid["scale"].default == 2.0
    assert all(math.isclose((v - 0.5) / 0.5, round((v - 0.5) / 0.5)) for v in grid["scale"].values), \
        "slider values must lie on the slider's step grid"


@pytest.mark.parametrize("budget", [1, 4, 9, 12, 36, 48])
def test_the_frame_budget_is_respected_and_defaults_stay(budget):
    controls = {"n": (1, 64), "scale": (0.5, 9.5, 0.5), "colour": ["C0", "C1", "C2", "C3"], "sorted_": True}
    grid = select_grid(_bars, controls, budget=budget)
    assert len(grid_points(grid)) <= budget
    defaults = {"n": 4, "scale": 2.0, "colour": "C0", "sorted_": True}
    assert {c.name: c.default for c in grid} == defaults
    moving = [c for c in grid if c.kind in ("range", "select")]
    assert all(len(c.values) >= 2 for c in moving)


def test_controls_that_do_not_fit_are_pinned_and_named_in_one_line():
    grid = select_grid(_bars, {"n": (1, 64), "scale": (0.5, 9.5, 0.5), "colour": ["C0", "C1", "C2"],
                               "pinned": ipywidgets.fixed(0.5)}, budget=9)
    kinds = {c.name: c.kind for c in grid}
    assert kinds == {"n": "range", "scale": "range", "colour": "pinned", "pinned": "fixed"}
    note = moving_note(grid)
    assert "n, scale can move" in note and "colour = C0" in note and "pinned" not in note
    assert moving_note(select_grid(_bars, {"n": (1, 8)})) == ""


def test_fixed_and_text_widgets_are_held_at_their_value():
    grid = _by_name(select_grid(_bars, {"pinned": ipywidgets.fixed(0.25), "scale": ipywidgets.FloatText(value=3.0)}))
    assert grid["pinned"].kind == "fixed" and grid["pinned"].default == 0.25
    assert grid["scale"].kind == "fixed" and grid["scale"].default == 3.0
    assert len(grid_points(list(grid.values()))) == 1


def test_log_slider_lists_dropdown_pairs_and_one_value_lists():
    grid = _by_name(select_grid(_bars, {
        "scale": ipywidgets.FloatLogSlider(value=7.5, base=10, min=-1, max=3, step=0.05),
        "colour": [("blue", "C0"), ("orange", "C1")],
        "n": [8],
    }, budget=100))
    assert grid["scale"].default == 7.5 and grid["scale"].values[0] == pytest.approx(0.1)
    assert grid["scale"].values[-1] == pytest.approx(1000.0)
    assert grid["colour"].kind == "select" and grid["colour"].labels == ["blue", "orange"]
    assert grid["colour"].values == ["C0", "C1"]
    assert grid["n"].kind == "pinned" and grid["n"].default == 8


def test_increasing_numeric_lists_become_sliders_and_others_menus():
    grid = _by_name(select_grid(_bars, {"n": [1, 2, 4, 8], "colour": ["C0", "C1"]}))
    assert grid["n"].kind == "range" and grid["n"].default == 4
    assert grid["colour"].kind == "select"


@pytest.mark.parametrize("controls, message", [
    ({"n": (1, 2, 3, 4)}, "slider is"),
    ({"n": (8, 1)}, "lo < hi"),
    ({"n": (1, 8, 0)}, "step > 0"),
    ({"n": []}, "empty list"),
    ({"nope": (1, 8)}, "not a parameter"),
    ({"n": "eight"}, "not a control"),
])
def test_bad_specs_raise_a_clear_value_error(controls, message):
    with pytest.raises(ValueError, match=message):
        select_grid(_bars, controls)


@pytest.mark.parametrize("call, message", [
    (lambda: viz.explore(_bars, budget=0, n=(1, 8)), "budget"),
    (lambda: viz.explore("not a function", n=(1, 8)), "callable"),
    (lambda: viz.explore(lambda n=1: None, n=(1, 8)), "must return a matplotlib Figure"),
    (lambda: viz.explore(_bars, colors=1000, n=(1, 8)), "colors"),
])
def test_explore_refuses_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()
    plt.close("all")


def _parse(html):
    frames = json.loads(re.search(r"var F=(\[.*?\]),O=", html).group(1))
    order = json.loads(re.search(r",O=(\[.*?\]),L=", html).group(1))
    return frames, order


def test_the_html_contract_the_browser_suite_relies_on():
    html = viz.explore(_bars, n=(1, 8), colour=["C0", "C1", "C2"]).data
    root = re.search(r'<div class="viz-explore" id="([^"]+)" data-frames="(\d+)">', html)
    assert root, "root element is <div class=\"viz-explore\" data-frames=\"N\">"
    n_frames = int(root.group(2))
    assert n_frames == len(grid_points(select_grid(_bars, {"n": (1, 8), "colour": ["C0", "C1", "C2"]}))) > 1
    assert re.search(r'<input type="range"[^>]* data-control="n"', html)
    assert re.search(r'<select[^>]* data-control="colour"', html)
    assert html.count('class="viz-explore-frame"') == 1 and html.count("<img") == 1
    assert "<script>" in html and "src=" not in html.split("<script>")[1].split("</script>")[0].replace(
        "img.src", ""), "the script must be inline, loading nothing"
    assert "http" not in html, "nothing may come from the network"
    frames, order = _parse(html)
    assert len(order) == n_frames and len(set(order)) > 1, "moving a control must change the picture"
    ids = re.findall(r'id="([^"]+)"', html)
    assert len(ids) == len(set(ids))
    other = viz.explore(_bars, n=(1, 8), colour=["C0", "C1", "C2"]).data
    assert not set(ids) & set(re.findall(r'id="([^"]+)"', other)), "two widgets on one page need distinct ids"


def test_every_frame_is_the_plot_functions_own_output():
    controls = {"n": (1, 8), "colour": ["C0", "C1"], "pinned": ipywidgets.fixed(0.5)}
    html = viz.explore(_bars, dpi=40, **controls).data
    frames, order = _parse(html)
    points = grid_points(select_grid(_bars, controls))
    with frame_dpi(40):
        default_fig = _bars(n=4, colour="C0", pinned=0.5)
    bbox = frame_bbox(default_fig)
    plt.close(default_fig)
    for index in (0, len(points) // 2, len(points) - 1):
        with frame_dpi(40):
            fig = _bars(**points[index])
        expected = render_png(fig, 40, bbox=bbox)
        plt.close(fig)
        assert base64.b64decode(frames[order[index]].split(",", 1)[1]) == expected, points[index]
    start = re.search(r'<img class="viz-explore-frame"[^>]* src="([^"]+)"', html).group(1)
    default = next(i for i, p in enumerate(points) if p["n"] == 4 and p["colour"] == "C0")
    assert start == frames[order[default]], "the page opens on the defaults' frame"


def test_explore_stays_small():
    html = viz.explore(_bars, n=(1, 64), scale=(0.5, 9.5, 0.5), colour=["C0", "C1", "C2", "C3"]).data
    assert len(html) < 400_000
    assert html.count("data:image/png;base64") <= 24


def _refuses_big(n=2, colour="C0"):
    if n > 4:
        raise ValueError(f"n must be at most 4, got {n}")
    return _bars(n=n, colour=colour)


def test_a_refused_combination_shows_the_functions_message_and_the_defaults_must_draw():
    html = viz.explore(_refuses_big, n=[1, 2, 8]).data
    frames, order = _parse(html)
    assert len(set(order)) == 3
    with pytest.raises(ValueError, match="at most 4"):
        viz.explore(_refuses_big, n=[8, 9])
    plt.close("all")


def test_frames_share_one_math_text_parser_and_its_cache():
    """Each new figure gets a new Agg renderer, whose math-text cache (log axes' 10^n labels) would start
    empty: render_png gives every frame's renderer the same parser, so a second frame re-parses only
    the labels the first did not have (measured: 4.6 CPU-s instead of 6.5 for part 0's first widget)."""
    from matplotlib.mathtext import MathTextParser

    def log_figure(top_decade):
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.loglog([1, 10, 10.0 ** top_decade], [1, 10, 10.0 ** top_decade])
        return fig

    def misses():
        return MathTextParser._parse_cached.cache_info().misses

    first, second = log_figure(7), log_figure(8)  # labels 10^0 ... 10^7, then one more decade
    before = misses()
    render_png(first, 37)  # a dpi no other test draws at: the cache holds none of these labels yet
    between = misses()
    render_png(second, 37)
    assert first.canvas.get_renderer().mathtext_parser is second.canvas.get_renderer().mathtext_parser
    assert between - before >= 3 and misses() - between <= 1, (before, between, misses())
    plt.close("all")


def test_inside_frame_dpi_even_a_plot_functions_own_layout_shares_the_parser():
    """tight_layout in a plot function measures text before render_png draws: the renderers made inside
    frame_dpi get the shared parser from the start; outside it, Matplotlib's own behaviour is back."""
    def laid_out():
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.loglog([1, 1e5], [1, 1e5])
        fig.tight_layout()
        return fig

    with frame_dpi(38):
        first, second = laid_out(), laid_out()
    assert first.canvas.get_renderer().mathtext_parser is second.canvas.get_renderer().mathtext_parser
    outside = laid_out()
    assert outside.canvas.get_renderer().mathtext_parser is not first.canvas.get_renderer().mathtext_parser
    plt.close("all")
