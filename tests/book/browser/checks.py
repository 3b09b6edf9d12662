"""What the browser suite checks on a loaded page, as functions of a Playwright ``Page``.

Each ``check_*`` returns a list of problems (one sentence each); an empty list means the page passes.
They are shared by the suite over the built book (``test_pages.py``) and by the tests of the
checks themselves on small fixture pages (``test_checks.py``).

The kernel-free widget contract (``utils.viz``): a root ``<div class="viz-explore" data-frames="N">``
holding controls (``<input type="range">`` or ``<select>``, each with ``data-control="<name>"``) and
one ``<img class="viz-explore-frame">`` whose ``src`` changes when a control moves.
"""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import Page

# Seconds to wait for an image to change after a control moves.
MOVE_TIMEOUT_MS = 5_000

# Raw TeX left in the rendered text: display/inline delimiters, environments, common commands.
_RAW_TEX_JS = r"""
() => {
  const root = document.querySelector('main') || document.body;
  const skip = 'pre, code, script, style, textarea, mjx-container, .highlight, .MathJax';
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const pattern = /\$\$|\\\(|\\\)|\\\[|\\\]|\\begin\{|\\(frac|mathrm|text|sum|times|cdot|sqrt|alpha|beta|gamma|theta)\b/;
  const raw = [];
  while (walker.nextNode()) {
    const node = walker.currentNode;
    if (node.parentElement && node.parentElement.closest(skip)) continue;
    if (pattern.test(node.textContent)) raw.push(node.textContent.trim().slice(0, 80));
  }
  const math = [...document.querySelectorAll('.math')];
  const untypeset = math.filter(el => !el.querySelector('mjx-container'))
                        .map(el => el.textContent.trim().slice(0, 80));
  return {count: math.length, untypeset, raw};
}
"""


def wait_for_mathjax(page: Page) -> bool:
    """Wait until MathJax has typeset the page; False if the page loads no MathJax."""
    return page.evaluate(
        """async () => {
          if (!document.querySelector('script[src*="mathjax"]')) return false;
          for (let i = 0; i < 200 && !(window.MathJax && MathJax.startup && MathJax.startup.promise); i++)
            await new Promise(r => setTimeout(r, 50));
          await MathJax.startup.promise;
          return true;
        }"""
    )


def check_math(page: Page) -> list[str]:
    """Every ``.math`` element holds MathJax output and no raw TeX is left in the text."""
    has_mathjax = wait_for_mathjax(page)
    found = page.evaluate(_RAW_TEX_JS)
    problems = [f"raw TeX left in the text: {text!r}" for text in found["raw"]]
    if found["count"] and not has_mathjax:
        problems.append(f"{found['count']} formulas but no MathJax script")
    problems += [f"formula not typeset: {text!r}" for text in found["untypeset"]]
    return problems


def check_images(page: Page) -> list[str]:
    """Every ``<img>`` has loaded a picture (``naturalWidth > 0``)."""
    broken = page.evaluate(
        """async () => {
          const imgs = [...document.images];
          imgs.forEach(i => { i.loading = 'eager'; });
          await Promise.all(imgs.map(i => i.complete ? null :
              new Promise(r => { i.addEventListener('load', r); i.addEventListener('error', r);
                                 setTimeout(r, 10000); })));
          return imgs.filter(i => !(i.naturalWidth > 0))
                     .map(i => (i.getAttribute('src') || i.outerHTML).slice(0, 100));
        }"""
    )
    return [f"image did not load: {src}" for src in broken]


def _frame_changes(page: Page, img_selector: str, move: Callable[[], object], what: str) -> list[str]:
    """Run ``move()`` and require the image ``img_selector`` to show a new, loaded picture."""
    img = page.locator(img_selector)
    before = img.get_attribute("src")
    move()
    try:
        page.wait_for_function(
            """([sel, before]) => { const i = document.querySelector(sel);
                 return i && i.getAttribute('src') !== before && i.complete && i.naturalWidth > 0; }""",
            arg=[img_selector, before],
            timeout=MOVE_TIMEOUT_MS,
        )
    except Exception:  # playwright's TimeoutError: report it as a problem of the page
        return [f"{what}: moving it did not change the picture"]
    return []


def _move(page: Page, control_selector: str) -> Callable[[], object]:
    """A function that moves one control as a reader would: a range by one step, a select to another option."""
    control = page.locator(control_selector)
    tag = control.evaluate("el => el.tagName.toLowerCase()")
    if tag == "select":
        values = control.evaluate("el => [...el.options].map(o => o.value)")
        current = control.input_value()
        other = next((v for v in values if v != current), None)
        return lambda: control.select_option(other) if other is not None else None
    at_max = control.evaluate("el => Number(el.value) >= Number(el.max || 100)")
    return lambda: (control.focus(), control.press("ArrowLeft" if at_max else "ArrowRight"))


def check_animations(page: Page) -> list[str]:
    """Every ``viz.animate`` animation (matplotlib jshtml) shows a frame, draws its button icons and scrubs.

    Its frame image has an ``alt`` text before and after the slider moves, and the slider a ``<label>``.
    """
    problems = []
    count = page.locator("div.animation").count()
    for k in range(count):
        root = f"div.animation >> nth={k}"
        info = page.locator(root).evaluate(
            """el => ({img: !!el.querySelector('img[id^=_anim_img]'),
                       slider: el.querySelector('input.anim-slider') ? Number(el.querySelector('input.anim-slider').max) : -1,
                       buttons: el.querySelectorAll('.anim-buttons button').length,
                       icons: el.querySelectorAll('.anim-buttons button svg').length,
                       imgId: (el.querySelector('img[id^=_anim_img]') || {}).id,
                       sliderId: (el.querySelector('input.anim-slider') || {}).id,
                       labelled: !!(el.querySelector('input.anim-slider') || {}).labels?.length})"""
        )
        name = f"animation {k + 1}"
        if not info["img"] or info["slider"] < 1:
            problems.append(f"{name}: no frame image or no slider with two frames or more")
            continue
        if info["icons"] != info["buttons"]:
            problems.append(f"{name}: {info['buttons'] - info['icons']} of {info['buttons']} buttons draw no icon")
        if not info["labelled"]:
            problems.append(f"{name}: the slider has no <label>")
        alt = _alt_text(page, info["imgId"])
        problems += _frame_changes(page, f"#{info['imgId']}", _move(page, f"#{info['sliderId']}"), f"{name} slider")
        alt_after = _alt_text(page, info["imgId"])
        if not alt or not alt_after:
            problems.append(f"{name}: the frame image has no alt text" + (" after the slider moved" if alt else ""))
    return problems


def _alt_text(page: Page, img_id: str) -> str:
    return (page.locator(f"#{img_id}").get_attribute("alt") or "").strip()


def check_widgets(page: Page) -> list[str]:
    """Every kernel-free widget (``div.viz-explore``) shows a frame and moving its first control changes it."""
    problems = []
    count = page.locator("div.viz-explore").count()
    for k in range(count):
        name = f"widget {k + 1}"
        root = page.locator("div.viz-explore").nth(k)
        widget_id = root.evaluate(
            "(el, k) => { el.dataset.vizTest = String(k); return el.dataset.vizTest; }", k
        )
        scope = f'div.viz-explore[data-viz-test="{widget_id}"]'
        info = root.evaluate(
            """el => ({frames: el.dataset.frames,
                       imgs: el.querySelectorAll('img.viz-explore-frame').length,
                       controls: [...el.querySelectorAll('[data-control]')].map(c =>
                           c.tagName.toLowerCase() + (c.type ? ':' + c.type : ''))})"""
        )
        frames = info["frames"]
        if frames is None or not frames.isdigit() or int(frames) < 1:
            problems.append(f"{name}: data-frames={frames!r} is not a positive whole number")
        if info["imgs"] != 1:
            problems.append(f"{name}: {info['imgs']} img.viz-explore-frame elements, expected exactly one")
            continue
        controls = info["controls"]
        if not controls:
            problems.append(f"{name}: no control with a data-control attribute")
            continue
        wrong = [c for c in controls if c not in ("input:range", "select:select-one")]
        if wrong:
            problems.append(f"{name}: controls must be <input type=range> or <select>, found {wrong}")
            continue
        img = f"{scope} img.viz-explore-frame"
        loaded = page.locator(img).evaluate("i => i.complete && i.naturalWidth > 0")
        if not loaded:
            problems.append(f"{name}: its frame image did not load")
            continue
        first = f"{scope} [data-control] >> nth=0"
        label = page.locator(first).get_attribute("data-control")
        problems += _frame_changes(page, img, _move(page, first), f"{name} control {label!r}")
    return problems


def check_timelines(page: Page) -> list[str]:
    """Every trace timeline (``svg.trace-timeline``, :mod:`utils.production.trace_timeline`) is drawn with bars,
    each bar has a tooltip, and the figure has an accessible name."""
    problems = []
    infos = page.evaluate(
        """() => [...document.querySelectorAll('svg.trace-timeline')].map(svg => {
               const rects = [...svg.querySelectorAll('rect')];
               const box = svg.getBoundingClientRect();
               return {label: svg.getAttribute('aria-label') || '', role: svg.getAttribute('role'),
                       width: box.width, height: box.height, rects: rects.length,
                       untitled: rects.filter(r => !(r.querySelector('title')?.textContent || '').trim()).length,
                       drawn: rects.filter(r => r.getBoundingClientRect().width > 0).length};
           })"""
    )
    for k, info in enumerate(infos):
        name = f"timeline {k + 1}"
        if info["width"] <= 0 or info["height"] <= 0:
            problems.append(f"{name}: not drawn ({info['width']} x {info['height']} px)")
        if info["rects"] == 0 or info["drawn"] == 0:
            problems.append(f"{name}: no bar drawn ({info['rects']} rect elements, {info['drawn']} visible)")
        if info["untitled"]:
            problems.append(f"{name}: {info['untitled']} bars without a <title> tooltip")
        if info["role"] != "img" or not info["label"].strip():
            problems.append(f"{name}: needs role=img and an aria-label")
    return problems
