"""Execute notebooks as a reader without Triton would (macOS, Windows): ``python .ci/run_without_triton.py NB [NB ...]``.

Triton publishes wheels for Linux only. This makes ``import triton`` fail in each
notebook's kernel exactly as it fails there (a ``triton`` package first on
PYTHONPATH whose import raises ``ModuleNotFoundError``), executes a copy of each
notebook top to bottom with nbclient (every cell, the live widgets too, as
``.ci/execute_notebook.py`` does), and fails on the first cell error. The notebooks
on disk are not written. ``make notebooks-without-triton`` runs it over every
notebook, JOBS at a time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from nbclient.exceptions import CellExecutionError

from execute_notebook import run  # .ci/execute_notebook.py, beside this script: the same client settings

ROOT = Path(__file__).resolve().parent.parent
BLOCKER = 'raise ModuleNotFoundError("No module named \'triton\'", name="triton")\n'


def blocker_dir() -> str:
    """A folder holding a ``triton`` package whose import fails as a missing module's does."""
    folder = Path(tempfile.mkdtemp(prefix="no-triton-"))
    (folder / "triton").mkdir()
    (folder / "triton" / "__init__.py").write_text(BLOCKER)
    return str(folder)


def execute(path: str, timeout: int) -> str | None:
    """Run a copy of the notebook without Triton; the error of the first failing cell, or None."""
    try:
        run(path, timeout)
    except CellExecutionError as err:
        return str(err)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+")
    parser.add_argument("--timeout", type=int, default=180, help="seconds one cell may run")
    args = parser.parse_args(argv)
    # The kernel inherits this environment: the blocker first, then the book's root (import utils).
    path = [blocker_dir(), str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(path)
    failed = []
    for nb in args.notebooks:
        error = execute(nb, args.timeout)
        print(f"{'FAILED' if error else 'ok':6s} {nb} (without Triton)", flush=True)
        if error:
            print(error, file=sys.stderr)
            failed.append(nb)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
