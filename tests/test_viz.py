import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from utils import viz  # noqa: E402


def _line(slope=1.0):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, slope])
    return fig


def test_animate_embeds_one_frame_per_step():
    pytest.importorskip("IPython", reason="a machine without Jupyter (the GPU machine)")
    calls = []

    def draw(ax, step):
        calls.append(step)
        ax.bar([0], [step])

    html = viz.animate(draw, 4).data
    assert "<script" in html and "animation" in html.lower()
    assert html.count("data:image/png;base64") == 4
    assert sorted(set(calls)) == [0, 1, 2, 3]


def _alts(page: str) -> list[str]:
    """The frame texts the player's script swaps into the image's alt, and the first one in the tag."""
    import json
    import re

    first = re.search(r'<img id="_anim_img\w+" alt="([^"]*)"', page)
    per_frame = re.search(r"var alts = (\[.*?\]);", page)
    assert first and per_frame, "the animation has no alt text"
    return [first.group(1), *json.loads(per_frame.group(1))]


def test_every_frame_has_an_alt_text_that_follows_it_and_the_slider_a_label():
    pytest.importorskip("IPython", reason="a machine without Jupyter (the GPU machine)")

    def draw(ax, step):
        ax.bar([0], [step])
        if step:
            ax.set_title(f"height {step}")

    page = viz.animate(draw, 3, label="Bar frame").data
    assert _alts(page) == ["Bar frame 1 of 3", "Bar frame 1 of 3", "Bar frame 2 of 3: height 1",
                           "Bar frame 3 of 3: height 2"]
    import re

    slider = re.search(r'<input id="(_anim_slider\w+)"', page).group(1)
    assert f'<label for="{slider}">Bar frame</label>' in page
    assert _alts(viz.animate(draw, 2, alt=["a", 'b "quoted"']).data)[1:] == ["a", 'b "quoted"']
    assert _alts(viz.animate(draw, 2, alt=lambda i: f"frame {i}").data)[1:] == ["frame 0", "frame 1"]
    assert _alts(viz.animate(draw, 2, alt="same").data) == ["same"] * 3


@pytest.mark.parametrize("kwargs, message", [
    ({"alt": ["only one"]}, "one string per frame"),
    ({"label": ""}, "label must be a non-empty string"),
])
def test_animate_refuses_alt_texts_that_do_not_match_the_frames(kwargs, message):
    with pytest.raises(ValueError, match=message):
        viz.animate(lambda ax, i: None, 2, **kwargs)


def test_a_page_that_is_not_an_animation_is_refused():
    with pytest.raises(ValueError, match="to_jshtml"):
        viz._with_frame_alts("<div></div>", ["x"], "frame")


def test_live_returns_an_interactive_widget():
    pytest.importorskip("ipywidgets", reason="a machine without Jupyter (the GPU machine)")
    widget = viz.live(_line, slope=(0.0, 2.0))
    assert [c.description for c in widget.children[:-1]] == ["slope"]
    plt.close("all")


@pytest.mark.parametrize("call", [
    lambda: viz.animate(lambda ax, i: None, 0),
    lambda: viz.animate("not a function", 3),
    lambda: viz.live(None),
])
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()


def test_live_starts_at_the_plot_functions_defaults():
    pytest.importorskip("ipywidgets", reason="a machine without Jupyter (the GPU machine)")
    widget = viz.live(_line, slope=(0.0, 4.0))
    assert widget.children[0].value == 1.0
    plt.close("all")
