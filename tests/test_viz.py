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
