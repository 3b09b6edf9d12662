"""Fill the book's jupyter-cache JOBS notebooks at a time, for `make book EXECUTE=1`.

    python .ci/execute_cache.py --config _build/config/execute.yml --jobs 2 NB [NB ...]

`make book EXECUTE=1` builds with ``execute_notebooks: cache``. For every notebook,
myst-nb's cache client (``myst_nb.core.execute.create_client``) looks the notebook up in
``_build/.jupyter_cache`` by jupyter-cache's hash (the code cells' source and metadata and
the kernelspec, not the outputs); on a miss it executes the notebook through nbclient
(``jupyter_cache.executors.utils.single_nb_execution``) and caches the result. Sphinx
does this one notebook at a time, so on a 2-core machine the executed build used one core.

This script runs that same client, the code the build runs, with the same settings (read
from the build's own config by jupyter-book and myst-nb: cell timeout, ``allow_errors``,
``exclude_patterns``, ``run_in_temp``, the cache folder), in ``--jobs`` processes, longest
notebook first. Cells tagged ``skip-execution`` are left out exactly as in the build
(nbclient's ``skip_cells_with_tag``). The build that follows then finds every notebook in
the cache ("Using cached notebook") and only renders. Before it returns, the script checks
that each notebook matches a cache record by the lookup myst-nb does, so the build cannot
silently execute a notebook again, one at a time.

A failure stops ``make`` before the build, with the notebook and the reason:

* a cell that raises (``allow_errors: false``): myst-nb's message and the cell's traceback;
* a cell that runs longer than the cell timeout (a hang included): ``CellTimeoutError``;
* a kernel that dies, or a worker process that dies: the exception and its traceback.

With ``--student-checks`` (``make test``) each lab's student edition is checked inside that same
execution (``utils.student_probe``): before each exercise's solution the kernel forks, and the child
runs the student edition from there; it must stop at a check that fails because of the reader's
unwritten code (and, for a known mistake, with its hint). The probes are silent requests: the lab's
outputs are those of a run without them. A lab that fails them fails the run, and its record is
taken out of the cache again.

Every notebook is attempted (the cache keeps the ones that succeed), the failures are
printed together at the end and the exit status is 1. Each finished notebook prints
``<path>: Executed notebook in N seconds``, the line ``.ci/repeat_book.py`` reads, and
``--timings FILE`` writes every notebook's status and seconds as JSON (``make slowest``).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path, PurePosixPath

import nbformat


@dataclass
class Outcome:
    """What happened to one notebook: ``status`` is "executed", "cached", "excluded" or "failed"."""

    path: str
    status: str
    seconds: float
    message: str = ""


class _PrintLogger:
    """The logger interface myst-nb's clients call (``info``, ``warning``, ...), printing ``<path>: <message>``.

    Warnings are also kept, so that a failure can be reported with myst-nb's own message.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.warnings: list[str] = []

    def _print(self, msg: str) -> None:
        print(f"{self.path}: {msg}", flush=True)

    def debug(self, msg: str, **kwargs) -> None:
        pass

    def info(self, msg: str, **kwargs) -> None:
        self._print(msg)

    def warning(self, msg: str, **kwargs) -> None:
        self.warnings.append(msg)
        self._print(msg.splitlines()[0] if msg else msg)

    error = critical = warning


@functools.lru_cache(maxsize=None)
def book_nb_config(config_path: Path, build_dir: Path):
    """myst-nb's settings for the build of ``jupyter-book build . --config CONFIG --path-output .``.

    jupyter-book turns the YAML into Sphinx settings (``get_final_config``); myst-nb reads its
    ``nb_*`` settings from them (``create_mystnb_config``) and puts the cache at
    ``<build dir>/.jupyter_cache`` unless ``execute.cache`` names one.
    """
    from jupyter_book.config import get_final_config
    from myst_nb.core.config import NbParserConfig

    if not config_path.is_file():
        raise ValueError(f"--config {config_path} is not a file: give the book's YAML config")
    sphinx_config, _ = get_final_config(user_yaml=config_path, cli_config={"latex_individualpages": False},
                                        sourcedir=Path.cwd())
    values = {}
    for name, _, field in NbParserConfig().as_triple():
        if not field.metadata.get("sphinx_exclude") and f"nb_{name}" in sphinx_config:
            values[name] = sphinx_config[f"nb_{name}"]
    nb_config = NbParserConfig(**values)
    cache_path = nb_config.execution_cache_path or str((build_dir / ".jupyter_cache").resolve())
    return nb_config.copy(execution_cache_path=cache_path)


def read_notebook(path: Path, nb_config):
    """The notebook and its settings as myst-nb's parser has them when it creates the client.

    Mirrors ``myst_nb.sphinx_.Parser.parse``: the reader for the file's suffix, the kernel
    name aliases, then the notebook-level overrides under ``metadata[nb_config.metadata_key]``.
    """
    from myst_nb.core.nb_to_tokens import nb_node_to_dict
    from myst_nb.core.read import create_nb_reader
    from myst_parser.config.main import MdParserConfig
    import re

    text = path.read_text(encoding="utf8")
    reader = create_nb_reader(str(path), MdParserConfig(), nb_config, text)
    if reader is None:
        raise ValueError(f"{path} is not a notebook myst-nb can read (expected a .ipynb file)")
    notebook = reader.read(text)
    kernel_name = notebook.metadata.get("kernelspec", {}).get("name", None)
    if kernel_name is not None and nb_config.kernel_rgx_aliases:
        for rgx, alias in nb_config.kernel_rgx_aliases.items():
            if re.fullmatch(rgx, kernel_name):
                notebook.metadata["kernelspec"]["name"] = alias
                break
    if nb_config.metadata_key in notebook.metadata:
        overrides = nb_node_to_dict(notebook.metadata[nb_config.metadata_key])
        overrides.pop("output_folder", None)
        nb_config = nb_config.copy(**overrides)
    return notebook, nb_config, reader.read_fmt


def is_excluded(path: Path, nb_config) -> bool:
    """True if the build would not execute ``path``: excluded by pattern, or not in cache mode."""
    if nb_config.execution_mode != "cache":
        return True
    posix_path = PurePosixPath(path.resolve().as_posix())
    return any(posix_path.match(pattern) for pattern in nb_config.execution_excludepatterns)


def stored_run_seconds(notebook) -> float:
    """Seconds the stored run took, from nbclient's per-cell timestamps (0.0 when there are none).

    From the first ``iopub.execute_input`` to the last ``shell.execute_reply``; used only to
    start the longest notebooks first, so that the last one to finish is a short one.
    """
    stamps = [cell.metadata.get("execution", {}) for cell in notebook.cells if cell.cell_type == "code"]
    starts = [s["iopub.execute_input"] for s in stamps if "iopub.execute_input" in s]
    ends = [s["shell.execute_reply"] for s in stamps if "shell.execute_reply" in s]
    if not starts or not ends:
        return 0.0
    try:
        start = datetime.datetime.fromisoformat(min(starts).replace("Z", "+00:00"))
        end = datetime.datetime.fromisoformat(max(ends).replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return max(0.0, (end - start).total_seconds())


# A kernel that dies before its first reply ran no cell, so starting it again is safe. It happens
# when kernels start side by side on a loaded machine (CI once lost one of two tiny notebooks so).
KERNEL_START_FAILURE = "Kernel died before replying to kernel_info"
KERNEL_START_ATTEMPTS = 3
# jupyter-cache's truncate_caches, run each time a notebook is stored, reads the records to keep and
# then the others in a second query: a record another process created in between (its file not yet
# written) is taken for one to delete, and remove_cache raises this KeyError. The notebook that hits it
# was stored before the truncation (and the other one's record is left alone: the error comes before
# anything is removed), so trying again finds it in the cache. CI met it once, with 75 notebooks.
CACHE_TRUNCATION_RACE = "Notebook file does not exist for cache record"
RETRIED = (KERNEL_START_FAILURE, CACHE_TRUNCATION_RACE)


def execute_one(path: str, config_path: str, build_dir: str, student_checks: bool = False) -> Outcome:
    """Run myst-nb's cache client on one notebook, as the build would (in a worker process).

    A kernel that dies before it replies to ``kernel_info`` (no cell has run), or jupyter-cache's
    truncation race (:data:`CACHE_TRUNCATION_RACE`), is tried again, up to :data:`KERNEL_START_ATTEMPTS`
    times in all; any other failure is final.
    """
    for attempt in range(1, KERNEL_START_ATTEMPTS + 1):
        outcome = _execute_once(path, config_path, build_dir, student_checks)
        if outcome.status != "failed" or not any(m in outcome.message for m in RETRIED):
            return outcome
        if attempt < KERNEL_START_ATTEMPTS:
            what = ("the kernel died before it started" if KERNEL_START_FAILURE in outcome.message
                    else "jupyter-cache's truncation raced another process")
            print(f"{path}: {what} (attempt {attempt}); trying again", flush=True)
    return outcome


def _execute_once(path: str, config_path: str, build_dir: str, student_checks: bool = False) -> Outcome:
    """One try of :func:`execute_one`.

    ``student_checks``: a lab's student edition is checked in the same execution (``utils.student_probe``:
    the kernel forks before each exercise's solution and runs the student edition from there). A lab
    that fails it is failed, and taken out of the cache again, so that no later run takes it as checked.
    """
    from contextlib import nullcontext

    from jupyter_cache import get_cache
    from myst_nb.core.execute import create_client

    from utils import student_probe

    start = time.monotonic()
    logger = _PrintLogger(path)
    try:
        nb_config = book_nb_config(Path(config_path), Path(build_dir))
        notebook, nb_config, read_fmt = read_notebook(Path(path), nb_config)
        if is_excluded(Path(path), nb_config):
            return Outcome(path, "excluded", 0.0)
        try:
            get_cache(nb_config.execution_cache_path).match_cache_notebook(notebook)
            return Outcome(path, "cached", time.monotonic() - start)
        except KeyError:
            pass
        probes = student_probe.lab_probes(Path(path)) if student_checks else []
        results: list = []
        # The build passes the absolute path (Sphinx's doc2path); the client runs the kernel in its folder.
        with student_probe.probing(probes, results) if probes else nullcontext(), \
                create_client(notebook, str(Path(path).resolve()), nb_config, logger, read_fmt) as client:
            meta = client.exec_metadata or {}
    except Exception as err:  # a cell error (myst-nb's ExecutionError), a dead kernel, a bad file
        detail = "\n".join(logger.warnings) or "".join(traceback.format_exception(err))
        return Outcome(path, "failed", time.monotonic() - start, f"{type(err).__name__}: {err}\n{detail}")
    if not meta.get("succeeded", False):
        detail = meta.get("traceback") or "\n".join(logger.warnings)
        return Outcome(path, "failed", time.monotonic() - start, f"{meta.get('error')}\n{detail}")
    if probes:
        found = student_probe.check_run(Path(path), results, probes)
        skipped = student_probe.skipped(results)
        if found:
            cache = get_cache(nb_config.execution_cache_path)
            cache.remove_cache(cache.match_cache_notebook(notebook).pk)
            return Outcome(path, "failed", time.monotonic() - start, "\n".join(found))
        print(f"{path}: student edition checked: {len(probes)} probes"
              + (f", skipped: {'; '.join(sorted(skipped))}" if skipped else ""), flush=True)
    return Outcome(path, "executed", time.monotonic() - start)


def check_cached(paths: list[str], config_path: Path, build_dir: Path) -> list[str]:
    """The notebooks the build would execute that do not match a cache record (myst-nb's lookup)."""
    from jupyter_cache import get_cache

    missing = []
    nb_config = book_nb_config(config_path, build_dir)
    cache = get_cache(nb_config.execution_cache_path)
    for path in paths:
        notebook, config, _ = read_notebook(Path(path), nb_config)
        if is_excluded(Path(path), config):
            continue
        try:
            cache.match_cache_notebook(notebook)
        except KeyError:
            missing.append(path)
    return missing


def write_timings(path: Path, outcomes: list[Outcome], jobs: int, wall_seconds: float) -> None:
    """Write each notebook's status and seconds, and the wall time, as JSON (read by ``.ci/timings.py``)."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "jobs": jobs, "wall_seconds": round(wall_seconds, 1),
        "notebooks": [{"path": o.path, "status": o.status, "seconds": round(o.seconds, 2)}
                      for o in sorted(outcomes, key=lambda o: -o.seconds)],
    }, indent=1) + "\n")


def run(paths: list[str], config_path: Path, build_dir: Path, jobs: int, timings: Path | None = None,
        student_checks: bool = False) -> int:
    """Execute ``paths`` into the cache ``jobs`` at a time; print a summary; 0 if all are cached.

    ``timings``: a JSON file to write each notebook's seconds to (``make slowest`` reads it).
    ``student_checks``: check each lab's student edition in the same execution (:func:`_execute_once`).
    """
    from jupyter_cache import get_cache

    if jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {jobs}")
    if not paths:
        raise ValueError("no notebooks given: pass the notebooks the book builds")
    for path in paths:
        if not Path(path).is_file():
            raise ValueError(f"{path} is not a file: pass notebook paths")
    nb_config = book_nb_config(config_path, build_dir)
    get_cache(nb_config.execution_cache_path).db  # create the database before the workers share it
    order = sorted(paths, key=lambda p: -stored_run_seconds(nbformat.read(p, as_version=4)))
    start = time.monotonic()
    print(f"Executing {len(order)} notebooks into {nb_config.execution_cache_path}, {jobs} at a time "
          f"(cell timeout {nb_config.execution_timeout} s)", flush=True)
    outcomes: list[Outcome] = []
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(execute_one, p, str(config_path), str(build_dir), student_checks): p for p in order}
        for future in as_completed(futures):
            try:
                outcome = future.result()
            except BrokenProcessPool as err:
                outcome = Outcome(futures[future], "failed", 0.0,
                                  f"a worker process died (killed, or out of memory?): {err}")
            outcomes.append(outcome)
            if outcome.status == "failed":
                print(f"{outcome.path}: FAILED, details below", flush=True)
    failed = [o for o in outcomes if o.status == "failed"]
    for o in failed:
        print(f"\n=== {o.path} failed ===\n{o.message}", flush=True)
    missing = [] if failed else check_cached(paths, config_path, build_dir)
    for path in missing:
        print(f"{path}: executed, but no cache record matches it: the build would execute it again", flush=True)
    counts = {s: sum(o.status == s for o in outcomes) for s in ("executed", "cached", "excluded", "failed")}
    if timings is not None and any(o.status in ("executed", "failed") for o in outcomes):
        write_timings(timings, outcomes, jobs, time.monotonic() - start)  # a run that only found the cache keeps the last
    print(f"{counts['executed']} executed, {counts['cached']} already cached, {counts['excluded']} excluded, "
          f"{counts['failed']} failed, in {time.monotonic() - start:.1f} s with {jobs} at a time", flush=True)
    return 1 if failed or missing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+")
    parser.add_argument("--config", type=Path, required=True, help="the YAML config the build uses")
    parser.add_argument("--build-dir", type=Path, default=Path("_build"),
                        help="the build's _build folder (jupyter-book's --path-output plus _build)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks executed at a time")
    parser.add_argument("--timings", type=Path, default=None,
                        help="write each notebook's seconds to this JSON file (make slowest reads it)")
    parser.add_argument("--student-checks", action="store_true",
                        help="check each lab's student edition in the same execution (utils.student_probe)")
    args = parser.parse_args(argv)
    return run(args.notebooks, args.config, args.build_dir, args.jobs, args.timings, args.student_checks)


if __name__ == "__main__":
    sys.exit(main())
