"""Execute notebooks in place, every cell, for `make execute`: ``python .ci/execute_notebook.py NB [NB ...]``.

Like ``jupyter nbconvert --execute --inplace``, with two differences:

* cells tagged ``skip-execution`` (the live widgets, which the book build skips) run
  too, so the stored notebook is executed top to bottom with no gaps;
* nbclient's Output-widget mimic is off (``widget_registry = {}``). The mimic sends
  on the shell socket while the client waits there for the cell's reply, which can
  lose that reply's wake-up for a whole cell timeout (README, "Why the live-widget
  cells are not executed by the book build"; ``.ci/widget_stall.py``: 0 stalls in
  600 widget cells with it off). The widget's output is then stored in the cell
  itself, where the ``remove-output`` tag keeps it out of the HTML.
"""

from __future__ import annotations

import argparse
import os
import sys

import nbformat
from nbclient import NotebookClient


def run(path: str, timeout: int) -> nbformat.NotebookNode:
    """The notebook at ``path`` executed top to bottom in its folder (every cell), not written back."""
    nb = nbformat.read(path, as_version=4)
    folder = os.path.dirname(os.path.abspath(path))
    client = NotebookClient(nb, timeout=timeout, skip_cells_with_tag="", resources={"metadata": {"path": folder}})
    client.widget_registry = {}
    client.execute()
    return nb


def execute(path: str, timeout: int) -> None:
    """Execute the notebook at ``path`` in place."""
    nbformat.write(run(path, timeout), path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+")
    parser.add_argument("--timeout", type=int, default=180, help="seconds one cell may run")
    args = parser.parse_args(argv)
    for path in args.notebooks:
        execute(path, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
