"""The student edition of the labs: the same notebooks with the reference solutions taken out.

In a lab, each exercise is a markdown cell with the ``{exercise}``, the
reader's attempt (a code cell that raises ``NotImplementedError`` until it is
written), then the reference solution between two markdown cells
````` ```{solution-start} label````` and ````` ```{solution-end}`````, then the
check. In Jupyter, "Run All" would run the solution right after the attempt and
overwrite it. :func:`student_notebook` drops every solution block (its markers,
and its code cells, which carry the tag :data:`SOLUTION_TAG`) and puts a short
"your turn" note in its place, so the check runs the reader's own code.

Two details keep the student labs running up to their checks:

* a solution cell that also defines a helper the later cells use but the
  attempt does not define (say ``split_saved`` in the activation-checkpointing
  lab) keeps that helper, in a code cell tagged :data:`GIVEN_TAG`;
* a block with no attempt cell before it gets a stub that raises
  ``NotImplementedError`` for each function or class of the solution.

``python -m utils.student_edition --tag NB [NB ...]`` tags the solution cells
of notebooks in place (metadata only; outputs untouched).
``python -m utils.student_edition --out _build/student`` writes the student
edition of every lab to ``_build/student/labs/...`` (what ``make student`` runs).
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

SOLUTION_TAG = "solution"
GIVEN_TAG = "given"
START, END = "{solution-start}", "{solution-end}"
ROOT = Path(__file__).resolve().parent.parent

YOUR_TURN = (
    "**Your turn.** This is the student edition: the reference solution of this exercise "
    "(`{label}`) is not here. Write yours in the cell above, run it, then run the check below. "
    "Until your code is right the check fails, and its message says which element differs, by how "
    "much, and what that usually means."
)


@dataclass
class Exercise:
    """One solution block: its label, the cells it spans, the reader's attempt and the solution's code."""

    label: str
    start: int  # index of the solution-start marker
    end: int  # index of the solution-end marker
    attempt: int | None  # index of the reader's attempt cell, the last code cell before the block
    solution: list[int] = field(default_factory=list)  # indices of the code cells inside the block

    def solution_source(self, nb: dict) -> str:
        return "\n\n".join(_source(nb["cells"][i]) for i in self.solution)


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _marker(cell: dict, marker: str) -> bool:
    return cell["cell_type"] == "markdown" and f"```{marker}" in _source(cell)


def exercises(nb: dict) -> list[Exercise]:
    """The solution blocks of a notebook, in order. Raises ValueError on an unclosed or nested block."""
    found, open_at = [], None
    cells = nb["cells"]
    for i, cell in enumerate(cells):
        if _marker(cell, START):
            if open_at is not None:
                raise ValueError(f"cell {i}: solution-start inside the block opened at cell {open_at}")
            open_at = i
        elif _marker(cell, END):
            if open_at is None:
                raise ValueError(f"cell {i}: solution-end with no solution-start before it")
            words = _source(cells[open_at]).split(START, 1)[1].split()
            label = words[0] if words and not words[0].startswith("```") else f"cell-{open_at}"
            previous_end = found[-1].end if found else -1
            attempt = next((k for k in range(open_at - 1, previous_end, -1) if cells[k]["cell_type"] == "code"),
                           None)
            solution = [k for k in range(open_at + 1, i) if cells[k]["cell_type"] == "code"]
            found.append(Exercise(label, open_at, i, attempt, solution))
            open_at = None
    if open_at is not None:
        raise ValueError(f"cell {open_at}: solution-start is never closed by solution-end")
    return found


def _defined(statement: ast.stmt) -> set[str]:
    """Names a top-level statement binds."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name}
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in statement.names}
    targets = statement.targets if isinstance(statement, ast.Assign) else \
        [statement.target] if isinstance(statement, (ast.AnnAssign, ast.AugAssign)) else []
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _parse(source: str) -> ast.Module:
    # IPython magics and shell escapes are not Python: blank them out before parsing.
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    return ast.parse("\n".join(lines))


def _names_used(source: str) -> set[str]:
    return {n.id for n in ast.walk(_parse(source)) if isinstance(n, ast.Name)}


def _given_and_stub(nb: dict, exercise: Exercise, used_later: set[str]) -> tuple[str, str]:
    """(helpers to keep, stub to add) for one exercise of the student edition; either may be ''."""
    attempt_names = set()
    if exercise.attempt is not None:
        attempt_names = {n for s in _parse(_source(nb["cells"][exercise.attempt])).body for n in _defined(s)}
    kept, stubs = [], []
    solution_names: set[str] = set()
    for i in exercise.solution:
        source = _source(nb["cells"][i])
        lines = source.splitlines()
        for statement in _parse(source).body:
            names = _defined(statement)
            solution_names |= names
            if names and not names & attempt_names and names & used_later:
                start = statement.lineno - 1 - len(getattr(statement, "decorator_list", []))
                kept.append("\n".join(lines[start:statement.end_lineno]))
    if not solution_names & attempt_names:
        for i in exercise.solution:
            for statement in _parse(_source(nb["cells"][i])).body:
                if isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
                    stubs.append(f"def {statement.name}(*args, **kwargs):\n"
                                 f"    raise NotImplementedError(\"your turn: write {statement.name} "
                                 f"(exercise {exercise.label})\")")
    given = ""
    if kept:
        given = "# Given: helpers the cells below use (not part of the exercise).\n\n" + "\n\n\n".join(kept)
    return given, "\n\n\n".join(stubs)


def _new_cell(cell_type: str, source: str, tags: list[str], role: str, label: str, with_id: bool) -> dict:
    """A cell the student edition adds; ``metadata.student_edition`` says which exercise and what for."""
    metadata: dict = {"tags": tags} if tags else {}
    metadata["student_edition"] = {"role": role, "exercise": label}
    cell = {"cell_type": cell_type, "metadata": metadata, "source": source}
    if with_id:  # nbformat >= 4.5 requires cell ids
        slug = "".join(c if c.isalnum() or c in "-_" else "-" for c in label)
        cell["id"] = f"student-{role}-{slug}"[:64]
    if cell_type == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def student_notebook(nb: dict) -> dict:
    """A copy of ``nb`` with every solution block replaced by a "your turn" note, and no stored outputs."""
    nb = copy.deepcopy(nb)
    found = exercises(nb)
    cells = nb["cells"]
    in_block = {k for e in found for k in range(e.start, e.end + 1)}
    replacement: dict[int, list[dict]] = {}
    for e in found:
        used_later = set()
        for k in range(e.end + 1, len(cells)):
            if cells[k]["cell_type"] == "code" and k not in in_block:
                used_later |= _names_used(_source(cells[k]))
        given, stub = _given_and_stub(nb, e, used_later)
        with_id = (nb.get("nbformat"), nb.get("nbformat_minor", 0)) >= (4, 5)
        new = []
        if stub:
            new.append(_new_cell("code", stub, [], "stub", e.label, with_id))
        new.append(_new_cell("markdown", YOUR_TURN.format(label=e.label), [], "your-turn", e.label, with_id))
        if given:
            new.append(_new_cell("code", given, [GIVEN_TAG], "given", e.label, with_id))
        replacement[e.start] = new
    out: list[dict] = []
    for k, cell in enumerate(cells):
        out += replacement.get(k, [])
        if k in in_block:
            continue
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
        out.append(cell)
    nb["cells"] = out
    return nb


def tag_solutions(path: Path) -> int:
    """Tag every code cell of every solution block of the notebook at ``path``; rewrite it only if that changed it.

    Returns the number of cells newly tagged. Only cell metadata changes.
    """
    nb = json.loads(path.read_text())
    changed = 0
    for e in exercises(nb):
        for i in e.solution:
            tags = nb["cells"][i].setdefault("metadata", {}).setdefault("tags", [])
            if SOLUTION_TAG not in tags:
                tags.append(SOLUTION_TAG)
                changed += 1
    if changed:
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return changed


def labs(root: Path = ROOT) -> list[Path]:
    """Every lab notebook, sorted."""
    return sorted(p for p in (root / "labs").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def build(out: Path, root: Path = ROOT) -> list[Path]:
    """Write the student edition of every lab under ``out`` (same tree: ``out/labs/NN-part/NN-name.ipynb``).

    ``out/chapters`` becomes a link to the book's chapters, so the labs' links to them work.
    """
    written = []
    for path in labs(root):
        target = out / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        nb = student_notebook(json.loads(path.read_text()))
        target.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        written.append(target)
    chapters = out / "chapters"  # the labs link to ../../chapters/...: keep those links working
    if not chapters.exists() and not chapters.is_symlink():
        chapters.symlink_to(os.path.relpath(root / "chapters", out), target_is_directory=True)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the student edition of every lab under this folder")
    parser.add_argument("--tag", nargs="+", type=Path, metavar="NB", help="tag the solution cells of these notebooks")
    args = parser.parse_args(argv)
    if not args.out and not args.tag:
        parser.error("give --out DIR, --tag NB [NB ...], or both")
    for path in args.tag or []:
        print(f"{path}: {tag_solutions(path)} solution cells newly tagged")
    if args.out:
        written = build(args.out)
        print(f"student edition of {len(written)} labs written under {args.out}/labs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
