"""The book's search page finds the key terms, and screenshots of a few pages for a person to look at."""

from __future__ import annotations

from pathlib import Path

import pytest

# term -> the page that teaches it, which must be among the results.
SEARCHES = {
    "all-reduce": "chapters/02-parallelism/02-collectives",
    "KV cache": "chapters/03-attention/04-serving-kv-cache-and-paged-attention",
    "Bellman": "chapters/04-rl/03-mdps-and-bellman-equations",
    "roofline": "chapters/01-gpu-architecture/04-rooflines",
}
SCREENSHOTS = {
    "intro": "intro.html",
    "rooflines": "chapters/01-gpu-architecture/04-rooflines.html",
    "collectives": "chapters/02-parallelism/02-collectives.html",
}


@pytest.mark.parametrize("term", SEARCHES)
def test_search_finds_the_page_that_teaches_it(term: str, site: tuple[Path, str], open_page: object) -> None:
    _, base = site
    page, log = open_page(base + "search.html?q=" + term.replace(" ", "+"))
    page.wait_for_function(
        "() => /Search finished|did not match/i.test((document.querySelector('#search-results') || {}).innerText || '')",
        timeout=30_000,
    )
    hrefs = page.eval_on_selector_all("#search-results ul.search li a", "els => els.map(a => a.href)")
    assert hrefs, f"no result for {term!r}"
    assert any(SEARCHES[term] in h for h in hrefs), f"{SEARCHES[term]} not among {hrefs[:10]}"
    assert not log.problems(), log.problems()


def test_screenshots(site: tuple[Path, str], open_page: object) -> None:
    root, base = site
    out = root.parent / "screenshots"
    out.mkdir(exist_ok=True)
    for name, path in SCREENSHOTS.items():
        page, _ = open_page(base + path)
        page.screenshot(path=str(out / f"{name}.png"))
        first = page.locator("div.animation, div.viz-explore").first
        if first.count():
            first.scroll_into_view_if_needed()
            first.screenshot(path=str(out / f"{name}-figure.png"))
        assert (out / f"{name}.png").stat().st_size > 10_000
