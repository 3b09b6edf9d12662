"""benchmarks.notebooks: runs notebooks as plain Python and reports each failure, hang and skipped widget."""

import json

import pytest

from benchmarks import notebooks


def _notebook(path, *cells):
    """Write a notebook of code cells: each a source string, or (source, tags)."""
    made = []
    for cell in cells:
        source, tags = cell if isinstance(cell, tuple) else (cell, [])
        made.append({"cell_type": "code", "metadata": {"tags": tags}, "source": source, "outputs": [],
                     "execution_count": None})
    path.write_text(json.dumps({"cells": made, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return str(path)


def test_reports_passes_failures_and_hangs(tmp_path, capsys):
    good = _notebook(tmp_path / "good.ipynb", "x = 21", "print('answer', 2 * x)",
                     ("raise RuntimeError('a live widget must not run')", ["skip-execution"]))
    bad = _notebook(tmp_path / "bad.ipynb", "y = 1", "y / 0")
    hung = _notebook(tmp_path / "hung.ipynb", "import time\ntime.sleep(600)")
    # the timeout covers each notebook's interpreter start and imports too: 5 s failed the good notebook once
    # (7 s) on a loaded CI machine, so 20 s, and the hung notebook sleeps far longer than that
    code = notebooks.main([good, bad, hung, "--jobs", "3", "--timeout", "20", "--log-dir", str(tmp_path / "logs")])
    out = capsys.readouterr().out
    assert code == 1
    assert "1 of 3 notebooks ran without error" in out
    assert "answer 42" in (tmp_path / "logs" / (good.replace("/", "_") + ".log")).read_text()
    assert f"FAIL {bad} cell 1" in out and "ZeroDivisionError" in out
    assert "timed out" in out and "hung.ipynb:cell0>\", line 2" in out  # faulthandler: where it hung


def test_all_passing_exits_zero_and_bad_arguments_are_refused(tmp_path, capsys):
    good = _notebook(tmp_path / "good.ipynb", "import utils")
    assert notebooks.main([good, "--log-dir", str(tmp_path)]) == 0
    assert "1 of 1 notebooks ran without error" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no such notebook"):
        notebooks.main([str(tmp_path / "missing.ipynb")])
    with pytest.raises(ValueError, match="--jobs"):
        notebooks.main([good, "--jobs", "0"])


def test_the_ipywidgets_stand_in_gives_explore_what_it_reads(monkeypatch):
    """On a GPU machine without Jupyter, widget controls must still become explore's controls."""
    from utils import explore

    stub = notebooks.ipywidgets_stub()
    monkeypatch.setitem(__import__("sys").modules, "ipywidgets", stub)
    assert stub.IntSlider is stub.IntSlider and isinstance(stub.IntSlider(value=3), stub.Widget)
    log = explore.make_control("x", stub.FloatLogSlider(value=100, min=0, max=4, step=1), explore._EMPTY)
    assert log.kind == "range" and 100 in log.values
    fixed = explore.make_control("y", stub.fixed(7), explore._EMPTY)
    assert fixed.kind == "fixed" and fixed.values == [7]
    menu = explore.make_control("z", stub.Dropdown(options={"a": 1, "b": 2}), explore._EMPTY)
    assert menu.values == [1, 2] and menu.labels == ["a", "b"]
