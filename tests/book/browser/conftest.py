"""Fixtures of the browser suite: Debian's Chromium driven by Playwright, offline, over a local server.

``BOOK_HTML`` (the built site, e.g. ``_build/html``; ``make browser`` sets it) turns on the tests of
the built book; without it they are skipped. The tests of the checks themselves need only the
browser: they run wherever Chromium and Playwright are installed, and are skipped elsewhere (in
``make unit`` on a fresh machine). With ``BOOK_HTML`` set, a missing browser is a failure, not a skip.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
except ImportError:  # the fixtures that need Playwright skip, or fail, saying so
    PlaywrightTimeoutError = TimeoutError

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# This machine's network is closed: without these flags Chromium's background services try
# other hosts and log refused connections.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
# How long a page may take to stop making requests once loaded; a page that does not is loaded once more.
NETWORK_IDLE_TIMEOUT_MS = 30_000


def book_root() -> Path | None:
    """The built site named by ``BOOK_HTML``, or None when the variable is unset."""
    value = os.environ.get("BOOK_HTML")
    if not value:
        return None
    root = Path(value).resolve()
    if not (root / "index.html").is_file():
        raise ValueError(f"BOOK_HTML={value} holds no index.html; build the book first (make book)")
    return root


def _unavailable(reason: str) -> None:
    if os.environ.get("BOOK_HTML"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """Headless Chromium from Debian's package (Playwright's own download is not used)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed: pip install -r requirements.txt")
    if not Path(CHROMIUM).is_file():
        _unavailable(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (make browser does)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass


@contextlib.contextmanager
def serve_directory(root: Path, handler: type = _QuietHandler) -> Iterator[str]:
    """Serve ``root`` on a free localhost port in a background thread; yields the base URL (ends in ``/``)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def site() -> Iterator[tuple[Path, str]]:
    """(root, base URL) of the built book, served on a free localhost port for the session."""
    root = book_root()
    if root is None:
        pytest.skip("BOOK_HTML is not set: make browser sets it to the built book")
    with serve_directory(root) as base:
        yield root, base


@dataclass
class PageLog:
    """What went wrong while a page loaded: console errors, failed requests, requests to other hosts."""

    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    offsite_requests: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        return (
            [f"request to another host (aborted): {u}" for u in self.offsite_requests]
            + [f"failed request: {r}" for r in self.failed_requests]
            + [f"console error: {e}" for e in self.console_errors]
        )


@pytest.fixture(scope="session")
def context(browser: object) -> Iterator[object]:
    """One browser context (a 1280x900 window) for the session."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    yield context
    context.close()


@pytest.fixture
def open_page(context: object) -> Iterator[object]:
    """``open_page(url) -> (page, PageLog)``: load ``url`` offline, logging what goes wrong.

    Every request to a host other than localhost is aborted and logged, so a page that would
    wait on another host fails. The log keeps filling while the test works the page. A page
    whose network does not go idle within :data:`NETWORK_IDLE_TIMEOUT_MS` is loaded once
    more with a clean log; if it stalls again the test fails, naming the requests in flight.
    """
    pages = []

    def load(url: str) -> tuple[object, PageLog]:
        log = PageLog()
        page = context.new_page()
        pages.append(page)

        def route(request_route: object) -> None:
            url = request_route.request.url
            if urlsplit(url).hostname in LOCAL_HOSTS:
                request_route.continue_()
            else:
                log.offsite_requests.append(url)
                request_route.abort("internetdisconnected")

        page.route("**/*", route)
        page.on("console", lambda m: m.type == "error" and log.console_errors.append(m.text))
        page.on("pageerror", lambda e: log.console_errors.append(f"uncaught {e}"))
        page.on("requestfailed", lambda r: log.failed_requests.append(f"{r.url} ({r.failure})"))
        page.on(
            "response",
            lambda r: r.status >= 400 and log.failed_requests.append(f"{r.url} (HTTP {r.status})"),
        )
        pending: dict[object, str] = {}  # requests in flight, to say which one a stalled page waits for
        page.on("request", lambda r: pending.__setitem__(r, r.url))
        page.on("requestfinished", lambda r: pending.pop(r, None))
        page.on("requestfailed", lambda r: pending.pop(r, None))
        for attempt in range(2):
            page.goto(url, wait_until="load")
            try:
                page.wait_for_load_state("networkidle", timeout=NETWORK_IDLE_TIMEOUT_MS)
                break
            except PlaywrightTimeoutError:
                stalled = sorted(set(pending.values()))
                if attempt == 1:
                    pytest.fail(f"{url}: the network never went idle, twice; still in flight: {stalled}")
                # once: a local request stalled on a loaded 2-core machine (seen in fresh-clone runs, a
                # different page each time); load the page again from a clean log, so a page that always
                # stalls still fails. The warning, in pytest's summary, says what was in flight.
                warnings.warn(f"{url}: the network did not go idle in {NETWORK_IDLE_TIMEOUT_MS / 1000:g} s, "
                              f"loading it again; in flight: {stalled}", stacklevel=1)
                log.console_errors.clear()
                log.failed_requests.clear()
                log.offsite_requests.clear()
                pending.clear()
        return page, log

    yield load
    for page in pages:
        page.close()
