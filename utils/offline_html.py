"""Sphinx extension of the book build: keep the HTML free of stylesheets from other hosts.

``_config.yml`` loads it (``sphinx.extra_extensions``); it lives in ``utils`` so that it is
importable wherever the build runs from.

Matplotlib's ``FuncAnimation.to_jshtml`` (behind ``utils.viz.animate``) writes a
``<link>`` to Font Awesome 4.4 on a CDN into every animation it stores in a cell
output, for the icons of its play/step buttons. The book's theme already serves
Font Awesome 6 from ``_static`` (as JavaScript that also knows the version-4 icon
names), which draws those icons, so the link is dropped from every page here.

It also keeps one copy of each inline script: sphinx-thebe adds its configuration
(``const THEBE_JS_URL = ...``) twice to every page, and the second copy throws
"Identifier 'THEBE_JS_URL' has already been declared" in the browser console.
``tests/book/site_links.py`` fails the tests if any page still loads a script,
stylesheet, image or frame from another host.
"""

from __future__ import annotations

import re
from typing import Any

from sphinx.application import Sphinx

# The exact tag matplotlib writes (matplotlib/_animation_data.py, JS_INCLUDE).
CDN_STYLESHEETS = re.compile(
    r'<link rel="stylesheet"\s+'
    r'href="https://maxcdn\.bootstrapcdn\.com/font-awesome/4\.4\.0/css/font-awesome\.min\.css">\s*'
)


def drop_cdn_stylesheets(html: str) -> str:
    """Return ``html`` without matplotlib's Font Awesome 4.4 CDN ``<link>`` tags."""
    return CDN_STYLESHEETS.sub("", html)


def unique_scripts(scripts: list[Any]) -> list[Any]:
    """``scripts`` (Sphinx's ``script_files``) without repeats of the same file or inline body.

    An inline script's file name is ``None`` or ``""`` depending on how it was added: both are one.
    """
    seen: set[tuple[str, str]] = set()
    kept = []
    for script in scripts:
        filename = getattr(script, "filename", script) or ""
        key = (str(filename), repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    return kept


def _on_page_context(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    body = context.get("body")
    if isinstance(body, str):
        context["body"] = drop_cdn_stylesheets(body)
    if isinstance(context.get("script_files"), list):
        context["script_files"] = unique_scripts(context["script_files"])


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("html-page-context", _on_page_context)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
