"""The widget check itself, on fixture pages of the kernel-free widget contract (no built book needed)."""

from __future__ import annotations

import base64
import struct
import time
import zlib

import pytest

import tests.book.browser.conftest as conftest
from tests.book.browser.checks import check_animations, check_images, check_timelines, check_widgets
from tests.book.browser.conftest import serve_directory


def png_data_uri(rgb: tuple[int, int, int]) -> str:
    """A 1x1 PNG of colour ``rgb`` as a data: URI (a frame of a fixture widget)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b"\x00" + bytes(rgb)))
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(png).decode()


FRAMES = [png_data_uri((40 * k, 0, 255 - 40 * k)) for k in range(6)]


def widget(wired: bool = True, frames: str = "6", img: bool = True) -> str:
    """One widget of the contract: a 3-step range and a 2-option select over 6 frames."""
    script = (
        "<script>(() => { const root = document.currentScript.parentElement;"
        f" const frames = {FRAMES!r};"
        " const img = root.querySelector('img.viz-explore-frame');"
        " const r = root.querySelector('[data-control=n]'), s = root.querySelector('[data-control=gpu]');"
        " const draw = () => { img.src = frames[Number(r.value) * 2 + s.selectedIndex]; };"
        " root.querySelectorAll('[data-control]').forEach(c => c.addEventListener('input', draw));"
        " })();</script>"
        if wired
        else ""
    )
    image = f'<img class="viz-explore-frame" src="{FRAMES[0]}">' if img else ""
    return (
        f'<div class="viz-explore" data-frames="{frames}">'
        '<input type="range" data-control="n" min="0" max="2" step="1" value="0">'
        '<select data-control="gpu"><option>A100</option><option>H100</option></select>'
        f"{image}{script}</div>"
    )


def test_a_working_widget_passes(browser: object) -> None:
    page = browser.new_page()
    page.set_content(f"<html><body>{widget()}{widget()}</body></html>")
    assert check_widgets(page) == []
    assert check_images(page) == []
    page.close()


def test_broken_widgets_are_reported(browser: object) -> None:
    page = browser.new_page()
    page.set_content(
        "<html><body>"
        + widget(wired=False)  # moving a control draws nothing new
        + widget(frames="many")  # data-frames not a number
        + widget(img=False)  # no frame image
        + '<div class="viz-explore" data-frames="1"><img class="viz-explore-frame" '
        f'src="{FRAMES[0]}"></div>'  # no control
        + "</body></html>"
    )
    problems = check_widgets(page)
    assert any(p.startswith("widget 1 control 'n':") and "did not change" in p for p in problems), problems
    assert any(p.startswith("widget 2: data-frames='many'") for p in problems), problems
    assert any(p.startswith("widget 3: 0 img.viz-explore-frame") for p in problems), problems
    assert any(p.startswith("widget 4: no control") for p in problems), problems
    assert len(problems) == 4, problems
    page.close()


def test_animations_need_an_alt_text_and_a_labelled_slider(browser: object) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.animation import FuncAnimation
    import matplotlib.pyplot as plt

    from utils import viz

    def draw(ax, step):
        ax.bar([0], [step + 1])
        ax.set_title(f"step {step}")

    fig, ax = plt.subplots(figsize=(2, 1), dpi=40)
    bare = FuncAnimation(fig, lambda i: (ax.clear(), draw(ax, i)) and [], frames=3).to_jshtml()  # neither
    plt.close(fig)
    page = browser.new_page()
    page.set_content("<html><body>" + viz.animate(draw, 3, figsize=(2, 1), dpi=40).data + bare + "</body></html>")
    # (their buttons' icons come from the book's Font Awesome, which this bare page does not load)
    problems = [p for p in check_animations(page) if not p.endswith("buttons draw no icon")]
    assert problems == ["animation 2: the slider has no <label>", "animation 2: the frame image has no alt text"], \
        problems
    assert page.locator("div.animation >> nth=0").locator("img").get_attribute("alt") == "Animation frame 2 of 3: step 1"
    page.close()


def test_the_page_log_catches_other_hosts_and_failed_requests(open_page: object, tmp_path) -> None:
    """open_page's log on a local page that asks another host and a missing local file."""
    (tmp_path / "page.html").write_text(
        '<html><body><img src="https://cdn.example.org/logo.png"><img src="missing.png">'
        "<script>console.error('broken')</script></body></html>"
    )
    with serve_directory(tmp_path) as base:
        page, log = open_page(base + "page.html")
        problems = log.problems()
    assert any(p.startswith("request to another host (aborted): https://cdn.example.org/logo.png") for p in problems)
    assert any("missing.png (HTTP 404)" in p for p in problems), problems
    assert "console error: broken" in problems, problems


def test_a_page_that_never_goes_idle_fails_naming_the_request(open_page: object, tmp_path, monkeypatch) -> None:
    """A local request that never completes: the page is loaded twice, then the test fails saying which."""

    class Slow(conftest._QuietHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path.startswith("/slow"):
                time.sleep(5)
            super().do_GET()

    monkeypatch.setattr(conftest, "NETWORK_IDLE_TIMEOUT_MS", 1_000)
    (tmp_path / "page.html").write_text("<html><body><script>fetch('/slow.txt')</script></body></html>")
    (tmp_path / "slow.txt").write_text("late")
    with serve_directory(tmp_path, Slow) as base:
        with pytest.raises(pytest.fail.Exception, match=r"never went idle, twice; still in flight: \[.*slow\.txt"), \
                pytest.warns(UserWarning, match=r"loading it again; in flight: \[.*slow\.txt"):
            open_page(base + "page.html")


def test_timelines_need_bars_tooltips_and_a_name(browser: object) -> None:
    from utils.production import trace_timeline as tt

    events = tt.read_chrome_trace({"traceEvents": [
        {"ph": "X", "name": "forward", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 2, "dur": 5}]})
    good = tt.timeline_html(events)
    broken = (good.replace('role="img"', "").replace("<title>", "<desc>").replace("</title>", "</desc>"))
    empty = '<svg class="trace-timeline" role="img" aria-label="x" width="100" height="20"></svg>'
    page = browser.new_page()
    page.set_content(f"<html><body>{good}</body></html>")
    assert check_timelines(page) == []
    page.set_content(f"<html><body>{good}{broken}{empty}</body></html>")
    problems = check_timelines(page)
    assert problems == ["timeline 2: 2 bars without a <title> tooltip", "timeline 2: needs role=img and an aria-label",
                        "timeline 3: no bar drawn (0 rect elements, 0 visible)"], problems
    page.close()
