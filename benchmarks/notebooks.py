"""Execute every notebook of the book as plain Python, for a GPU machine that has torch and triton but no Jupyter.

Run from the repository root::

    python -m benchmarks.notebooks                      # every notebook in chapters/ and labs/, 4 at a time
    python -m benchmarks.notebooks labs/03-attention/*.ipynb --jobs 1 --log-dir /tmp/nb

Each notebook runs in its own process: its code cells in order in one namespace, the
cells tagged ``skip-execution`` (the live widgets) left out, and small stand-ins for
``IPython.display`` and ``ipywidgets`` where those are not installed (nothing to install).
Cell output goes to one log per notebook. The summary lists every notebook with its time,
and for each failure the cell, its first lines and the traceback's end; the exit code is 1
if any failed. A notebook that hangs is stopped after ``--timeout`` seconds with a Python
traceback of where it was (``faulthandler``).

On a GPU, several notebooks at once share the GPU: timings printed in the logs are then
not clean measurements (``--jobs 1`` for those); the point of this script is that every
cell runs on the GPU without error.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import json
import linecache
import os
import signal
import subprocess
import sys
import time
import traceback
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _stub_missing_modules() -> None:
    """Stand-ins for IPython.display and ipywidgets where they are not installed (a GPU box without Jupyter)."""
    try:
        import IPython.display  # noqa: F401
    except ImportError:
        ipython, display = types.ModuleType("IPython"), types.ModuleType("IPython.display")
        ipython.__file__ = display.__file__ = "<stub>"
        ipython.get_ipython = lambda: None
        ipython.version_info = (9, 0)

        class HTML:
            def __init__(self, data=None):
                self.data = data

        display.HTML = display.Markdown = HTML
        display.display = lambda *args, **kwargs: None
        ipython.display = display
        sys.modules["IPython"], sys.modules["IPython.display"] = ipython, display
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        sys.modules["ipywidgets"] = ipywidgets_stub()


_SLIDER_DEFAULTS = {  # ipywidgets 8's defaults, so a slider given only some keywords reads like the real one
    "IntSlider": dict(value=0, min=0, max=100, step=1),
    "FloatSlider": dict(value=0.0, min=0.0, max=10.0, step=0.1),
    "FloatLogSlider": dict(value=1.0, base=10.0, min=0.0, max=4.0, step=0.1),
}


def ipywidgets_stub() -> types.ModuleType:
    """A stand-in ``ipywidgets`` module: every attribute is a class (one per name, so ``isinstance`` works)
    whose instances keep their keywords (``value``, ``min``, ``max``, ``step``, ``base``, ``options``), which
    is all that :func:`utils.explore.make_control` reads; ``fixed(v)`` keeps ``v`` as ``.value``."""
    widgets = types.ModuleType("ipywidgets")
    widgets.__file__ = "<stub>"

    class Widget:
        def __init__(self, *args, **kwargs):
            for key, value in {**_SLIDER_DEFAULTS.get(type(self).__name__, {}), **kwargs}.items():
                setattr(self, key, value)
            options = kwargs.get("options")
            if options is not None:
                pairs = list(options.items()) if isinstance(options, dict) else \
                    [o if isinstance(o, tuple) else (str(o), o) for o in options]
                self._options_labels = [str(label) for label, _ in pairs]
                self._options_values = [value for _, value in pairs]
                if "value" not in kwargs:
                    self.value = self._options_values[0]

        def __getattr__(self, name):  # observe, layout, ...: accept and ignore
            if name.startswith("_"):
                raise AttributeError(name)
            return lambda *args, **kwargs: None

    class fixed:  # noqa: N801  (ipywidgets' name)
        def __init__(self, value):
            self.value = value

    widgets.Widget, widgets.fixed = Widget, fixed

    def class_for(name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (Widget,), {})
        setattr(widgets, name, cls)
        return cls

    widgets.__getattr__ = class_for
    return widgets


def run_one(path: str) -> int:
    """Execute one notebook's code cells in this process; print each cell's output; 0 if all ran, else 1."""
    import faulthandler

    faulthandler.register(signal.SIGTERM, chain=False)  # a timeout shows where the notebook hung
    _stub_missing_modules()
    import matplotlib

    matplotlib.use("agg")
    cells = json.loads(Path(path).read_text())["cells"]
    namespace = {"__name__": "__main__", "display": lambda *args, **kwargs: None}
    start, ran = time.time(), 0
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code" or "skip-execution" in cell["metadata"].get("tags", []):
            continue
        source = "".join(cell["source"])
        name = f"<{path}:cell{i}>"
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)  # for inspect.getsource (Triton)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(source, name, "exec"), namespace)
        except Exception:
            print(out.getvalue())
            print(f"FAIL {path} cell {i} after {time.time() - start:.1f} s\n{source[:400]}\n"
                  f"{traceback.format_exc()[-3000:]}")
            return 1
        ran += 1
        if out.getvalue().strip():
            print(f"[cell {i}]\n{out.getvalue().rstrip()}")
    print(f"OK {path}: {ran} cells in {time.time() - start:.1f} s")
    return 0


NOT_STARTED = -1
"""The exit code reported for a notebook that ``--deadline`` left unstarted."""


def _run_in_subprocess(path: str, timeout: float, log_dir: Path, deadline: float = float("inf"),
                       threads: int | None = None) -> tuple[str, int, float, str]:
    """Run one notebook in a child process; return (path, exit code, seconds, log file). Code 124: timed out;
    :data:`NOT_STARTED`: the ``deadline`` (a ``time.time()``) had passed; a notebook running at the deadline is
    stopped there. ``threads`` sets the child's ``OMP_NUM_THREADS`` (unless the caller's environment does), so
    that notebooks run side by side do not each start a thread per core."""
    log = log_dir / (path.replace("/", "_") + ".log")
    start = time.time()
    if start >= deadline:
        return path, NOT_STARTED, 0.0, str(log)
    timeout = min(timeout, deadline - start)
    with open(log, "w") as f:
        env = os.environ | {"PYTHONUNBUFFERED": "1", "MPLBACKEND": "agg", "BOOK_BATCH_EXECUTION": "1"}
        if threads and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(threads)
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.notebooks", "--one", path], stdout=f,
                                stderr=subprocess.STDOUT, env=env)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()  # SIGTERM: faulthandler prints the stack
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
            code = 124
    return path, code, time.time() - start, str(log)


def _failure_summary(log: str, code: int) -> str:
    if code == NOT_STARTED:
        return "not started: the --deadline had passed"
    text = Path(log).read_text()
    if code == 124:
        return "timed out; where it was:\n" + text[-1500:]
    i = text.find("FAIL ")
    return text[i:i + 2500] if i >= 0 else text[-1500:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.notebooks", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", help="notebooks (default: every chapters/*/*.ipynb and labs/*/*.ipynb)")
    parser.add_argument("--jobs", type=int, default=4, help="notebooks at once (default 4)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per notebook (default 300)")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds from now after which no notebook starts and running ones are stopped")
    parser.add_argument("--log-dir", default="_build/notebook-logs", help="one log per notebook here")
    parser.add_argument("--one", metavar="PATH", help=argparse.SUPPRESS)  # the child process's entry point
    args = parser.parse_args(argv)
    if args.one:
        return run_one(args.one)
    if args.jobs < 1 or args.timeout <= 0:
        raise ValueError(f"--jobs must be >= 1 and --timeout > 0, got {args.jobs} and {args.timeout}")
    paths = args.paths or sorted(glob.glob("chapters/*/*.ipynb") + glob.glob("labs/*/*.ipynb"))
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise ValueError(f"no such notebook: {', '.join(missing)}")
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.deadline if args.deadline else float("inf")
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda p: _run_in_subprocess(p, args.timeout, log_dir, deadline, threads), paths))
    failed = [(path, code, log) for path, code, _, log in results if code != 0]
    for path, code, seconds, _ in results:
        status = "ok  " if code == 0 else ("SKIP" if code == NOT_STARTED else "FAIL")
        print(f"{status} {seconds:6.1f} s  {path}")
    for path, code, log in failed:
        print(f"\n=== {path} (exit code {code}, log {log})\n{_failure_summary(log, code)}")
    print(f"\n{len(results) - len(failed)} of {len(results)} notebooks ran without error; logs in {log_dir}/")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
