"""Where `make test`'s time went: its stages, and the slowest notebooks, cells and tests (`make slowest`).

    python .ci/timings.py [--dir .cache/timings] [--top 10] [--stages-only]

Reads what the last `make test` left in ``--dir``:

- ``stages.tsv``: each stage's wall time, start and end (``.ci/stage.py``); the total is the run's
  wall time, first start to last end, since some stages run side by side;
- ``notebooks.json``: each notebook's seconds in the executed build (``.ci/execute_cache.py --timings``);
- ``unit.xml`` and ``browser.xml``: pytest's JUnit reports of the unit tests and the browser suite;

and, for the slowest cells, the per-cell times that nbclient stored in the notebooks themselves
at their last ``make execute`` (the build's executor does not record cells). It reports only;
it never fails because something is slow (speed is measured here, not asserted).
Standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import xml.etree.ElementTree as ElementTree
from typing import NamedTuple
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:4.1f} s" if seconds >= 60 else f"{seconds:.1f} s"


class Stage(NamedTuple):
    """One line of ``stages.tsv``: a stage's name, wall seconds, exit status, and its start and end
    (seconds since the epoch; ``None`` in a log written before stages ran side by side)."""

    name: str
    seconds: float
    status: int
    start: float | None = None
    end: float | None = None


def read_stages(folder: Path) -> list[Stage]:
    """Each stage of the last ``make test``, in the order the stages ended."""
    path = folder / "stages.tsv"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        name, seconds, status, *span = line.split("\t")
        start, end = (float(span[0]), float(span[1])) if len(span) == 2 else (None, None)
        rows.append(Stage(name, float(seconds), int(status), start, end))
    return rows


def wall_seconds(stages: list[Stage]) -> float:
    """The run's wall time: first start to last end, or the sum of the stages if a log has no spans."""
    if stages and all(s.start is not None for s in stages):
        return max(s.end for s in stages) - min(s.start for s in stages)
    return sum(s.seconds for s in stages)


def read_notebooks(folder: Path) -> dict | None:
    path = folder / "notebooks.json"
    return json.loads(path.read_text()) if path.is_file() else None


def read_junit(path: Path) -> list[tuple[float, str]]:
    """``(seconds, test id)`` of every test case in a JUnit XML report, slowest first."""
    if not path.is_file():
        return []
    cases = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        cases.append((float(case.get("time", 0.0)), name))
    return sorted(cases, reverse=True)


def stored_cell_seconds(root: Path = ROOT) -> list[tuple[float, str]]:
    """``(seconds, "notebook cell N")`` from nbclient's timestamps stored in the notebooks, slowest first."""
    cells = []
    for path in sorted(p for folder in ("chapters", "labs") for p in (root / folder).rglob("*.ipynb")
                       if ".ipynb_checkpoints" not in p.parts):
        notebook = json.loads(path.read_text())
        for index, cell in enumerate(notebook["cells"]):
            stamps = cell.get("metadata", {}).get("execution", {})
            if cell["cell_type"] != "code" or "skip-execution" in cell.get("metadata", {}).get("tags", []):
                continue
            if "iopub.execute_input" in stamps and "shell.execute_reply" in stamps:
                start, end = (datetime.datetime.fromisoformat(stamps[k].replace("Z", "+00:00"))
                              for k in ("iopub.execute_input", "shell.execute_reply"))
                cells.append(((end - start).total_seconds(), f"{path.relative_to(root)} cell {index}"))
    return sorted(cells, reverse=True)


def stage_report(folder: Path) -> list[str]:
    stages = read_stages(folder)
    if not stages:
        return [f"no stage times in {folder}: run make test"]
    timed = all(s.start is not None for s in stages)
    first = min(s.start for s in stages) if timed else 0.0
    lines = ["make test, stage by stage" + (" (from: when it started; stages side by side share the cores):"
                                            if timed else ":")]
    notebooks = read_notebooks(folder)
    for stage in sorted(stages, key=lambda s: s.start) if timed else stages:
        note = "" if stage.status == 0 else f"  (failed, exit status {stage.status})"
        when = f"  from {_minutes(stage.start - first)}" if timed else ""
        lines.append(f"  {stage.name:<16} {_minutes(stage.seconds):>14}{when}{note}")
        if stage.name == "execute" and notebooks:
            ran = [n for n in notebooks["notebooks"] if n["status"] == "executed"]
            total = sum(n["seconds"] for n in ran)
            lines.append(f"    {len(ran)} notebooks, {notebooks['jobs']} at a time: {_minutes(total)} of notebook time")
    lines.append(f"  {'total (wall)':<16} {_minutes(wall_seconds(stages)):>14}")
    return lines


def slowest_report(folder: Path, top: int) -> list[str]:
    lines = []
    notebooks = read_notebooks(folder)
    if notebooks:
        lines += [f"The {top} slowest notebooks of the last executed build:"]
        lines += [f"  {n['seconds']:7.1f} s  {n['path']}" for n in notebooks["notebooks"][:top]]
    cells = stored_cell_seconds()
    if cells:
        lines += [f"The {top} slowest cells (their times as stored by the last make execute):"]
        lines += [f"  {seconds:7.1f} s  {name}" for seconds, name in cells[:top]]
    for report, title in (("unit.xml", "unit tests"), ("browser.xml", "browser tests")):
        cases = read_junit(folder / report)
        if cases:
            lines += [f"The {top} slowest {title} (of {len(cases)}, {_minutes(sum(s for s, _ in cases))} in all):"]
            lines += [f"  {seconds:7.1f} s  {name}" for seconds, name in cases[:top]]
    return lines or [f"no timings in {folder}: run make test"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=ROOT / ".cache" / "timings", help="where make test wrote its timings")
    parser.add_argument("--top", type=int, default=10, help="how many of the slowest to list")
    parser.add_argument("--stages-only", action="store_true", help="print the stage breakdown only")
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error(f"--top must be at least 1, got {args.top}")
    lines = stage_report(args.dir)
    if not args.stages_only:
        lines += [""] + slowest_report(args.dir, args.top)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
