""".ci/check_outputs.py: the cells tagged nbval-check-output against the executed build's cache, by nbval's rules."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_outputs", ROOT / ".ci" / "check_outputs.py")
check_outputs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_outputs)


def _stream(text: str, name: str = "stdout"):
    return nbformat.v4.new_output("stream", name=name, text=text)


def _result(plain: str, png: str | None = None):
    data = {"text/plain": plain} | ({"image/png": png} if png else {})
    return nbformat.v4.new_output("execute_result", data=data, execution_count=1)


def test_nbval_rules_streams_joined_images_skipped_and_sanitized():
    patterns = [(r"0x[0-9a-fA-F]+", "0xADDRESS")]
    compare = check_outputs.compare_outputs
    assert compare([_stream("a\nb\n")], [_stream("a\n"), _stream("b\n")], patterns) is None  # joined streams
    assert compare([_result("1", png="AAAA")], [_result("1", png="BBBB")], patterns) is None  # images skipped
    assert compare([_stream("at 0x7f12\n")], [_stream("at 0xdead\n")], patterns) is None  # sanitized
    assert compare([_stream("x\r"), _stream("done\n")], [_stream("done\n")], patterns) is None  # \r applied
    assert "stdout differs" in compare([_stream("0.82\n")], [_stream("0.83\n")], patterns)
    assert "output kinds differ" in compare([_stream("1\n")], [_result("1")], patterns)


def test_a_checked_cell_that_changed_fails_and_the_others_pass(tmp_path):
    """End to end: execute two tiny notebooks into the build's cache, then change one stored output."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_ci_execute_cache import _book_config, _notebook  # the same tiny-notebook helpers

    config, build_dir = _book_config(tmp_path), tmp_path / "_build"
    paths = [_notebook(tmp_path / "a.ipynb", [("print(6 * 7)", ["nbval-check-output"]), "print('unchecked')"]),
             _notebook(tmp_path / "b.ipynb", [("print('b')", ["nbval-check-output"])])]
    for path in paths:  # the stored outputs: what `make execute` would have written
        nb = nbformat.read(path, as_version=4)
        nb.cells.insert(0, nbformat.v4.new_markdown_cell("# A page"))  # jupyter-cache keeps code cells only
        nb.cells[1].outputs = [_stream("42\n" if path.name == "a.ipynb" else "b\n")]
        if path.name == "a.ipynb":
            nb.cells[2].outputs = [_stream("anything: not checked\n")]
        nbformat.write(nb, path)
    run = subprocess.run([sys.executable, str(ROOT / ".ci" / "execute_cache.py"), "--config", str(config),
                          "--build-dir", str(build_dir), "--jobs", "2", "a.ipynb", "b.ipynb"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    args = ["--config", str(config), "--build-dir", str(build_dir), "--sanitize", str(ROOT / "tests/nbval_sanitize.cfg")]
    assert check_outputs.main(args + [str(p) for p in paths]) == 0

    nb = nbformat.read(paths[1], as_version=4)  # a stored output that the code no longer prints
    nb.cells[1].outputs = [_stream("c\n")]
    nbformat.write(nb, paths[1])
    assert check_outputs.main(args + [str(p) for p in paths]) == 1
    nb.cells[1].source = "print('c')"  # a changed source: not in the cache until executed again
    nbformat.write(nb, paths[1])
    assert check_outputs.main(args + [str(paths[1])]) == 1
