""".ci/execute_cache.py: the executed build's notebooks run JOBS at a time into myst-nb's jupyter-cache.

The end-to-end tests execute tiny notebooks in real kernels, then ask myst-nb's own cache client
(what `jupyter-book build` runs for each notebook) whether it would execute them again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "execute_cache.py"
_spec = importlib.util.spec_from_file_location("execute_cache", SCRIPT)
execute_cache = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("execute_cache", execute_cache)
_spec.loader.exec_module(execute_cache)


def _book_config(tmp_path: Path, exclude: list[str] | None = None) -> Path:
    """The repository's _config.yml as `make book EXECUTE=1` rewrites it (cache mode), plus exclusions."""
    text = (ROOT / "_config.yml").read_text()
    text = text.replace('execute_notebooks: "off"', "execute_notebooks: cache")
    assert "execute_notebooks: cache" in text, "_config.yml no longer has the line the Makefile rewrites"
    if exclude:
        text = text.replace("execute:\n", "execute:\n  exclude_patterns: [" + ", ".join(exclude) + "]\n")
    path = tmp_path / "execute.yml"
    path.write_text(text)
    return path


def _notebook(path: Path, cells: list, metadata: dict | None = None) -> Path:
    """Write a notebook of code cells; a cell is its source or (source, tags)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata.update(metadata or {})
    for cell in cells:
        source, tags = cell if isinstance(cell, tuple) else (cell, [])
        code = nbformat.v4.new_code_cell(source)
        if tags:
            code.metadata["tags"] = tags
        nb.cells.append(code)
    nbformat.write(nb, path)
    return path


class _Recorder:
    """Stands in for myst-nb's Sphinx logger and keeps what it is told."""

    def __init__(self):
        self.messages: list[str] = []

    def info(self, msg, **kwargs):
        self.messages.append(msg)

    warning = error = debug = info


def _build_client_messages(path: Path, config: Path, build_dir: Path) -> list[str]:
    """What myst-nb's cache client logs for ``path`` in the build (it executes on a cache miss)."""
    from myst_nb.core.execute import create_client

    nb_config = execute_cache.book_nb_config(config, build_dir)
    notebook, nb_config, read_fmt = execute_cache.read_notebook(path, nb_config)
    logger = _Recorder()
    with create_client(notebook, str(path.resolve()), nb_config, logger, read_fmt):
        pass
    return logger.messages


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def test_settings_are_the_builds(tmp_path):
    nb_config = execute_cache.book_nb_config(_book_config(tmp_path), tmp_path / "_build")
    assert nb_config.execution_mode == "cache"
    assert nb_config.execution_timeout == 180
    assert nb_config.execution_allow_errors is False
    assert nb_config.execution_raise_on_error is True
    assert nb_config.execution_in_temp is False
    assert Path(nb_config.execution_cache_path) == (tmp_path / "_build" / ".jupyter_cache").resolve()


def test_missing_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is not a file"):
        execute_cache.book_nb_config(tmp_path / "nope.yml", tmp_path / "_build")


def test_bad_arguments_are_refused(tmp_path):
    config = _book_config(tmp_path)
    with pytest.raises(ValueError, match="--jobs must be at least 1"):
        execute_cache.run([str(_notebook(tmp_path / "a.ipynb", ["1"]))], config, tmp_path / "_build", 0)
    with pytest.raises(ValueError, match="is not a file"):
        execute_cache.run([str(tmp_path / "missing.ipynb")], config, tmp_path / "_build", 2)


def test_exclude_patterns_match_as_in_myst_nb(tmp_path):
    config = _book_config(tmp_path, exclude=['"**/skipped/*"'])
    nb_config = execute_cache.book_nb_config(config, tmp_path / "_build")
    (tmp_path / "skipped").mkdir()
    assert execute_cache.is_excluded(tmp_path / "skipped" / "x.ipynb", nb_config)
    assert not execute_cache.is_excluded(tmp_path / "kept.ipynb", nb_config)
    assert execute_cache.is_excluded(tmp_path / "kept.ipynb", nb_config.copy(execution_mode="off"))


def test_stored_run_seconds_from_cell_timestamps(tmp_path):
    path = _notebook(tmp_path / "t.ipynb", ["1", "2", "3"])
    nb = nbformat.read(path, as_version=4)
    assert execute_cache.stored_run_seconds(nb) == 0.0
    nb.cells[0].metadata["execution"] = {"iopub.execute_input": "2026-11-23T10:00:00.000000Z",
                                         "shell.execute_reply": "2026-11-23T10:00:01.000000Z"}
    nb.cells[2].metadata["execution"] = {"iopub.execute_input": "2026-11-23T10:00:05.000000Z",
                                         "shell.execute_reply": "2026-11-23T10:00:12.500000Z"}
    assert execute_cache.stored_run_seconds(nb) == pytest.approx(12.5)


def test_executes_into_the_cache_the_build_reads_and_fails_on_errors_and_timeouts(tmp_path):
    config = _book_config(tmp_path)
    build_dir = tmp_path / "_build"
    good = _notebook(tmp_path / "good.ipynb", [
        "x = 6 * 7\nprint(x)",
        ("raise RuntimeError('a skip-execution cell ran')", ["skip-execution"]),
        "print('last cell', x)",
    ])
    bad = _notebook(tmp_path / "bad.ipynb", ["print('first')", "raise ValueError('boom in the second cell')"])
    # jupyter-cache lets a notebook's metadata set its own timeout; the build honours it too.
    slow = _notebook(tmp_path / "slow.ipynb", ["import time\ntime.sleep(60)"], {"execution": {"timeout": 2}})
    timings = tmp_path / "timings" / "notebooks.json"
    done = _run(["--config", str(config), "--build-dir", str(build_dir), "--jobs", "2", "--timings", str(timings),
                 "good.ipynb", "bad.ipynb", "slow.ipynb"], cwd=tmp_path)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    record = json.loads(timings.read_text())  # what `make slowest` reads, failures included
    assert record["jobs"] == 2 and record["wall_seconds"] > 0
    assert {n["path"]: n["status"] for n in record["notebooks"]} == {
        "good.ipynb": "executed", "bad.ipynb": "failed", "slow.ipynb": "failed"}
    assert "good.ipynb: Executed notebook in" in out
    assert "=== bad.ipynb failed ===" in out and "boom in the second cell" in out and "CellExecutionError" in out
    assert "=== slow.ipynb failed ===" in out and "CellTimeoutError" in out
    assert "1 executed, 0 already cached, 0 excluded, 2 failed" in out

    # The build's own client finds the good notebook cached, with its outputs, and executes nothing.
    messages = _build_client_messages(good, config, build_dir)
    assert any(m.startswith("Using cached notebook") for m in messages), messages
    assert not any("Executing notebook" in m for m in messages), messages
    cached = execute_cache.check_cached([str(good), str(bad), str(slow)], config, build_dir)
    assert cached == [str(bad), str(slow)]


def test_a_dead_worker_fails_the_run(tmp_path):
    # The kernel kills the worker process that runs its client (JPY_PARENT_PID: also when make test forks
    # its kernels from a server, utils.forked_kernels), then itself.
    _notebook(tmp_path / "kill.ipynb",
              ["import os, signal\nos.kill(int(os.environ['JPY_PARENT_PID']), signal.SIGKILL)\nos._exit(1)"])
    # A killed client cannot remove its kernel's connection file and sockets (a forked kernel's are in the
    # temporary folder, utils.forked_kernels): they go to a folder of this test's own, removed after it
    # (a short path: a Unix socket's path has at most 107 characters).
    scratch = Path(tempfile.mkdtemp(prefix="bk-"))
    try:
        done = _run(["--config", str(_book_config(tmp_path)), "--build-dir", str(tmp_path / "_build"),
                     "--jobs", "1", "kill.ipynb"], cwd=tmp_path, env={**os.environ, "TMPDIR": str(scratch)})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "=== kill.ipynb failed ===" in done.stdout
    assert "a worker process died" in done.stdout


def test_a_kernel_that_dies_before_starting_is_started_again(monkeypatch, capsys):
    tries = []

    def flaky(path, config_path, build_dir, student_checks):
        tries.append(path)
        if len(tries) == 1:
            return execute_cache.Outcome(path, "failed", 0.1, f"RuntimeError: {execute_cache.KERNEL_START_FAILURE}")
        return execute_cache.Outcome(path, "executed", 1.0)

    monkeypatch.setattr(execute_cache, "_execute_once", flaky)
    assert execute_cache.execute_one("a.ipynb", "c.yml", "_build").status == "executed"
    assert len(tries) == 2 and "the kernel died before it started (attempt 1); trying again" in capsys.readouterr().out


def test_jupyter_caches_truncation_race_is_tried_again_and_found_cached(monkeypatch, capsys):
    tries = []

    def raced(path, config_path, build_dir, student_checks):
        tries.append(path)
        if len(tries) == 1:
            return execute_cache.Outcome(path, "failed", 20.0, "KeyError: 'Notebook file does not exist for cache "
                                                               "record PK: 58'")
        return execute_cache.Outcome(path, "cached", 0.1)

    monkeypatch.setattr(execute_cache, "_execute_once", raced)
    assert execute_cache.execute_one("a.ipynb", "c.yml", "_build").status == "cached"
    assert len(tries) == 2 and "truncation raced another process" in capsys.readouterr().out


@pytest.mark.parametrize("message, tries_expected", [
    ("CellExecutionError: ZeroDivisionError", 1),  # a cell failed: final at once
    (f"RuntimeError: {'Kernel died before replying to kernel_info'}", 3),  # never starts: give up after 3
])
def test_other_failures_are_final_and_start_retries_are_bounded(monkeypatch, message, tries_expected):
    tries = []

    def failing(path, config_path, build_dir, student_checks):
        tries.append(path)
        return execute_cache.Outcome(path, "failed", 0.1, message)

    monkeypatch.setattr(execute_cache, "_execute_once", failing)
    assert execute_cache.execute_one("a.ipynb", "c.yml", "_build").status == "failed"
    assert len(tries) == tries_expected


def _lab(path: Path, check: str) -> Path:
    """A lab of one exercise (attempt, solution block, check), as utils.student_edition reads labs."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    solution = nbformat.v4.new_code_cell("def add(a, b):\n    return a + b")
    solution.metadata["tags"] = ["solution"]
    nb.cells = [nbformat.v4.new_code_cell("def add(a, b):\n    raise NotImplementedError('your turn')"),
                nbformat.v4.new_markdown_cell("```{solution-start} ex-add\n```"), solution,
                nbformat.v4.new_markdown_cell("```{solution-end}\n```"), nbformat.v4.new_code_cell(check)]
    nbformat.write(nb, path)
    return path


def test_student_checks_fail_a_lab_whose_check_misses_the_readers_code_and_uncache_it(tmp_path, capsys):
    config, build_dir = _book_config(tmp_path), tmp_path / "_build"
    good = _lab(tmp_path / "good_lab.ipynb", "assert add(1, 2) == 3")
    bad = _lab(tmp_path / "bad_lab.ipynb", "assert 1 + 2 == 3  # never calls add")
    assert execute_cache._execute_once(str(good), str(config), str(build_dir), student_checks=True).status == "executed"
    assert "good_lab.ipynb: student edition checked: 1 probes" in capsys.readouterr().out
    outcome = execute_cache._execute_once(str(bad), str(config), str(build_dir), student_checks=True)
    assert outcome.status == "failed"
    assert "student edition: exercise ex-add: no check ran the reader's code" in outcome.message
    # the full lab itself ran without an error, but it is not left in the cache as if it had passed
    assert execute_cache.check_cached([str(good), str(bad)], config, build_dir) == [str(bad)]
    # without the flag (a reader's make book EXECUTE=1) a lab is executed as any notebook
    assert execute_cache._execute_once(str(bad), str(config), str(build_dir)).status == "executed"
