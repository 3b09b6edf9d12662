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
    hung = _notebook(tmp_path / "hung.ipynb", "import time\ntime.sleep(60)")
    code = notebooks.main([good, bad, hung, "--jobs", "3", "--timeout", "5", "--log-dir", str(tmp_path / "logs")])
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
