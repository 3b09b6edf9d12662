"""Offline check of a built HTML site: every internal link and anchor resolves, nothing loads from another host.

Run it on the built book (``make links`` does)::

    python -m tests.book.site_links _build/html

For every ``.html`` page under the root (``_static`` and ``_sources`` aside) it reads each
``href``/``src`` and reports:

* an internal link (``page.html``, ``../a/b.html#id``, ``#id``) whose file does not exist, or
  whose ``#id`` names no element (``id=`` or ``<a name=>``) of that page;
* a script, stylesheet, image, frame or media source on another host (``http(s)://`` or ``//``):
  a page that waits on another host does not render offline. Links a reader follows
  (``<a href="https://...">``) are fine.

Pure Python (``html.parser``), no browser: about a second for the whole book.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

# Tags whose URL attribute the browser fetches while it renders the page.
ASSET_ATTRIBUTES = {
    "script": "src",
    "link": "href",
    "img": "src",
    "iframe": "src",
    "source": "src",
    "video": "src",
    "audio": "src",
    "embed": "src",
    "object": "data",
}
SKIPPED_DIRS = ("_static", "_sources", "_images")
IGNORED_SCHEMES = ("mailto", "javascript", "data", "tel")


@dataclass
class PageLinks:
    """What one page declares: the ids it defines and the URLs it refers to (tag, url)."""

    ids: set[str] = field(default_factory=set)
    urls: list[tuple[str, str]] = field(default_factory=list)


class _PageParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = PageLinks()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value for name, value in attrs if value is not None}
        if "id" in values:
            self.page.ids.add(values["id"])
        if tag == "a" and "name" in values:
            self.page.ids.add(values["name"])
        if tag == "a" and "href" in values:
            self.page.urls.append((tag, values["href"]))
        elif tag in ASSET_ATTRIBUTES and ASSET_ATTRIBUTES[tag] in values:
            if tag == "link" and "canonical" in values.get("rel", "").split():
                return  # a page's canonical address, not fetched
            self.page.urls.append((tag, values[ASSET_ATTRIBUTES[tag]]))

    handle_startendtag = handle_starttag


def parse_page(path: Path) -> PageLinks:
    """Ids and URLs of the HTML file ``path``."""
    parser = _PageParser()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    return parser.page


def html_pages(root: Path) -> list[Path]:
    """Every ``.html`` page under ``root``, the theme's and Sphinx's asset folders aside, sorted."""
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory; build the book first (make book)")
    pages = [
        p for p in root.rglob("*.html") if not p.relative_to(root).parts[0] in SKIPPED_DIRS
    ]
    if not pages:
        raise ValueError(f"{root} holds no .html page; build the book first (make book)")
    return sorted(pages)


@dataclass
class Report:
    """The result of :func:`check_site`: counts, and one line per problem."""

    pages: int = 0
    links: int = 0
    anchors: int = 0
    problems: list[str] = field(default_factory=list)


def check_site(root: Path) -> Report:
    """Resolve every internal link and anchor of the site under ``root``; flag assets on other hosts."""
    root = Path(root).resolve()
    pages = {p: parse_page(p) for p in html_pages(root)}
    report = Report(pages=len(pages))
    for page, links in pages.items():
        name = page.relative_to(root).as_posix()
        for tag, url in links.urls:
            parts = urlsplit(url)
            if parts.scheme in IGNORED_SCHEMES:
                continue
            if parts.scheme or parts.netloc:
                if tag != "a":
                    report.problems.append(f"{name}: <{tag}> loads {url} from another host")
                continue
            report.links += 1
            target = page
            if parts.path:
                rel = PurePosixPath(unquote(parts.path))
                target = (page.parent / rel).resolve() if not rel.is_absolute() else root / rel.relative_to("/")
                if parts.path.endswith("/") or target.is_dir():
                    target = target / "index.html"
                if not target.is_file():
                    report.problems.append(f"{name}: <{tag}> {url}: no file {target}")
                    continue
            fragment = unquote(parts.fragment)
            if not fragment or target.suffix != ".html":
                continue
            report.anchors += 1
            target_links = pages.get(target) or parse_page(target)
            if fragment not in target_links.ids:
                report.problems.append(
                    f"{name}: <{tag}> {url}: no element with id {fragment!r} in "
                    f"{target.relative_to(root).as_posix() if target.is_relative_to(root) else target}"
                )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the built site, e.g. _build/html")
    args = parser.parse_args(argv)
    report = check_site(args.root)
    for line in report.problems:
        print(line)
    print(
        f"{report.pages} pages, {report.links} internal links, {report.anchors} anchors: "
        f"{len(report.problems)} problems"
    )
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
