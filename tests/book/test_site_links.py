"""The offline link checker on tiny sites written here: it finds what it must and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.book.site_links import check_site, main


def write_site(root: Path, pages: dict[str, str]) -> Path:
    for name, body in pages.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"<!DOCTYPE html><html><head></head><body>{body}</body></html>")
    return root


def test_a_clean_site_has_no_problem(tmp_path: Path) -> None:
    site = write_site(
        tmp_path,
        {
            "index.html": '<a href="chapters/a.html#sec-1">a</a><a href="#top">top</a><p id="top"></p>'
            '<a href="https://example.org/paper.pdf">a paper, followed by the reader</a>'
            '<script src="_static/app.js"></script><a href="mailto:x@y.z">mail</a>',
            "chapters/a.html": '<section id="sec-1"><a href="../index.html">home</a>'
            '<a href="b.html#x%20y">b</a><a name="old"></a><a href="#old">old</a></section>'
            '<img src="../_images/f.png">',
            "chapters/b.html": '<span id="x y"></span><a href="./">folder index</a>',
            "chapters/index.html": "",
            "_static/app.js": "",
            "_images/f.png": "",
        },
    )
    report = check_site(site)
    assert report.problems == []
    assert report.pages == 4
    assert report.anchors == 4  # sec-1, top, "x y", old
    # links: chapters/a.html#sec-1, #top, app.js, ../index.html, b.html#x%20y, #old, f.png, ./
    assert report.links == 8


def test_broken_file_anchor_and_cdn_asset_are_reported(tmp_path: Path) -> None:
    site = write_site(
        tmp_path,
        {
            "index.html": '<a href="missing.html">gone</a><a href="a.html#nowhere">no anchor</a>'
            '<a href="#self-missing">self</a>',
            "a.html": '<link rel="stylesheet" href="https://cdn.example.com/fa.css">'
            '<script src="//cdn.example.com/require.js"></script><p id="here"></p>',
        },
    )
    problems = check_site(site).problems
    assert len(problems) == 5, problems
    assert any("missing.html" in p and "no file" in p for p in problems)
    assert any("no element with id 'nowhere' in a.html" in p for p in problems)
    assert any("'self-missing' in index.html" in p for p in problems)
    assert any("<link> loads https://cdn.example.com/fa.css from another host" in p for p in problems)
    assert any("<script> loads //cdn.example.com/require.js" in p for p in problems)


def test_cli_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write_site(tmp_path / "good", {"index.html": '<a href="#x" id="x">x</a>'})
    bad = write_site(tmp_path / "bad", {"index.html": '<a href="#x">x</a>'})
    assert main([str(good)]) == 0
    assert main([str(bad)]) == 1
    assert "1 problems" in capsys.readouterr().out


def test_missing_or_empty_site_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="build the book first"):
        check_site(tmp_path / "nope")
    with pytest.raises(ValueError, match="no .html page"):
        check_site(tmp_path)
