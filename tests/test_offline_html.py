"""utils.offline_html: the CDN link matplotlib writes is dropped; repeated scripts are kept once."""

from __future__ import annotations

from matplotlib._animation_data import JS_INCLUDE
from sphinx.builders.html._assets import _JavaScript

from utils.offline_html import drop_cdn_stylesheets, unique_scripts


def test_matplotlib_font_awesome_link_is_dropped_and_nothing_else() -> None:
    assert "maxcdn.bootstrapcdn.com" in JS_INCLUDE  # what matplotlib writes today
    html = "<p>before</p>" + JS_INCLUDE + "<p>after</p>"
    cleaned = drop_cdn_stylesheets(html)
    assert "maxcdn" not in cleaned and "<link" not in cleaned
    assert cleaned.startswith("<p>before</p>\n<script") and "isInternetExplorer" in cleaned
    assert drop_cdn_stylesheets("<link rel=\"stylesheet\" href=\"_static/a.css\">") == (
        "<link rel=\"stylesheet\" href=\"_static/a.css\">"
    )


def test_repeated_inline_scripts_are_kept_once() -> None:
    body = "const THEBE_JS_URL = 'x'"
    scripts = [
        _JavaScript(None, body=body),
        _JavaScript("a.js"),
        _JavaScript("", body=body),
        _JavaScript(None, body="other"),
        _JavaScript("a.js"),
    ]
    kept = unique_scripts(scripts)
    assert [(s.filename, s.attributes.get("body")) for s in kept] == [
        (None, body),
        ("a.js", None),
        (None, "other"),
    ]
