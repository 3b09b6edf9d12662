"""Every page of the built book, in headless Chromium with no network (``BOOK_HTML`` set).

On each page: no console error, no failed request, no request to another host; every formula
typeset; every image loaded; every animation and kernel-free widget drawn, and moving one of its
controls changes the picture; every trace timeline drawn with a tooltip per bar; every link of the sidebar answers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.book.browser.checks import check_animations, check_images, check_math, check_timelines, check_widgets
from tests.book.browser.conftest import book_root
from tests.book.site_links import html_pages

# Sidebar links already fetched this session (the sidebar repeats on every page).
_checked_links: dict[str, int] = {}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "page_path" in metafunc.fixturenames:
        root = book_root()
        if root is None:
            params = [pytest.param(None, marks=pytest.mark.skip(reason="BOOK_HTML is not set"))]
        else:
            params = [p.relative_to(root).as_posix() for p in html_pages(root)]
        metafunc.parametrize("page_path", params)


def sidebar_problems(page: object, context: object) -> list[str]:
    """Fetch every link of the left sidebar (once per session) and require HTTP 200."""
    hrefs = page.evaluate(
        """() => [...document.querySelectorAll('#pst-primary-sidebar a[href]')]
                  .map(a => a.href.split('#')[0]).filter(h => h.startsWith(location.origin))"""
    )
    problems = []
    for href in dict.fromkeys(hrefs):
        if href not in _checked_links:
            _checked_links[href] = context.request.get(href).status
        if _checked_links[href] != 200:
            problems.append(f"sidebar link {href}: HTTP {_checked_links[href]}")
    return problems


def test_page(page_path: str, site: tuple[Path, str], open_page: object, context: object) -> None:
    _, base = site
    page, log = open_page(base + page_path)
    problems = check_math(page) + check_images(page) + check_animations(page) + check_widgets(page)
    problems += check_timelines(page)
    problems += sidebar_problems(page, context)
    problems += log.problems()
    assert not problems, f"{page_path}:\n  " + "\n  ".join(problems)
