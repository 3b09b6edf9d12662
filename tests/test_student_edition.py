"""The student edition of the labs (`make student`) fails at the checks, and nowhere else.

How that is checked is :mod:`utils.student_probe`: the full lab runs, and before each exercise's
solution the kernel forks; the child runs the student edition from there and must stop at a check
that fails because of the reader's unwritten code (a ``NotImplementedError`` from an attempt, or a
:class:`utils.hints.CheckFailed` with its hint, the same inside a ``WorkerError``). For a few labs a
known mistake is tried too (``utils.student_probe.mistakes``): its check must give the hint that
names it. Every exercise must be caught. The checks passing once the solutions run, and the cells
before the first exercise, are the full lab's own run.

`make test` runs the probes in its execute stage, inside the one execution of each lab
(``.ci/execute_cache.py --student-checks``), and sets ``BOOK_STUDENT_CHECKS=execute`` for the unit
tests, which then skip :func:`test_student_lab_fails_at_the_checks_and_nowhere_else` instead of
running every lab a second time. Run alone (``pytest tests/test_student_edition.py``, ``make
unit``), it executes each lab up to its last exercise with the same probes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from utils import student_probe
from utils.student_edition import GIVEN_TAG, SOLUTION_TAG, build, exercises, labs, student_notebook

ROOT = Path(__file__).resolve().parent.parent
LABS = labs(ROOT)
TIMEOUT = 300  # seconds per cell
# The kernels' environment, as `make` sets it (Makefile), so that running this file directly with pytest
# gives the same run: one thread per kernel (two labs run at once on 2 workers), and utils.progress's
# one-line progress instead of a live bar.
KERNEL_ENV = {"OMP_NUM_THREADS": "1", "BOOK_BATCH_EXECUTION": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
CHECKED_BY_EXECUTE = os.environ.get("BOOK_STUDENT_CHECKS") == "execute"


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def run_probed_lab(path: Path) -> tuple[list[student_probe.Probe], list[tuple[student_probe.Probe, dict]]]:
    """Execute the full lab up to its last probe's cell, with the probes; return them and their results."""
    probes = student_probe.lab_probes(path)
    nb = nbformat.read(path, as_version=4)
    nb.cells = nb.cells[:max(p.at for p in probes) + 1]  # the last probe's child runs the rest itself
    client = NotebookClient(nb, timeout=TIMEOUT, kernel_name="python3", skip_cells_with_tag="skip-execution",
                            resources={"metadata": {"path": str(path.parent)}})
    client.widget_registry = {}
    results: list = []
    with student_probe.probing(probes, results):
        client.execute(env={**os.environ, **KERNEL_ENV})
    return probes, results


@pytest.mark.skipif(CHECKED_BY_EXECUTE, reason="make test checks the student editions in its execute stage "
                    "(.ci/execute_cache.py --student-checks), inside the one execution of each lab")
@pytest.mark.parametrize("path", LABS, ids=_ids(LABS))
def test_student_lab_fails_at_the_checks_and_nowhere_else(path):
    start = time.perf_counter()
    probes, results = run_probed_lab(path)
    skipped = student_probe.skipped(results)
    if skipped:
        pytest.skip(f"the student edition cannot be probed here: {'; '.join(sorted(skipped))}")
    found = student_probe.check_run(path.relative_to(ROOT), results, probes)
    assert not found, "\n".join(found)
    assert {p.label for p in probes} == {e.label for e in exercises(json.loads(path.read_text()))}
    assert any(p.hint for p in probes) == (path.stem in student_probe.mistakes())
    print(f"{path.relative_to(ROOT)}: {time.perf_counter() - start:.1f} s, {len(probes)} probes")


def test_the_student_edition_has_no_solution_and_keeps_the_rest(tmp_path):
    written = build(tmp_path, ROOT)
    assert [p.relative_to(tmp_path) for p in written] == [p.relative_to(ROOT) for p in LABS]
    for path, target in zip(LABS, written):
        full, student = json.loads(path.read_text()), json.loads(target.read_text())
        nbformat.validate(nbformat.from_dict(student))
        blocks = exercises(full)
        assert not exercises(student), f"{target.name}: a solution block is left"
        assert not any(SOLUTION_TAG in c["metadata"].get("tags", []) for c in student["cells"])
        assert all(not c.get("outputs") for c in student["cells"] if c["cell_type"] == "code")
        solution = {i for e in blocks for i in e.solution}
        kept = [c["source"] for i, c in enumerate(full["cells"])
                if not any(e.start <= i <= e.end for e in blocks)]
        added = [c["metadata"].get("student_edition", {}).get("role") for c in student["cells"]]
        assert [c["source"] for c, role in zip(student["cells"], added) if role is None] == kept
        n_turns = added.count("your-turn")
        assert n_turns == len(blocks), f"{target.name}: {n_turns} 'your turn' notes for {len(blocks)} exercises"
        for cell in student["cells"]:
            if GIVEN_TAG in cell["metadata"].get("tags", []):
                given = "".join(cell["source"])
                for i in solution:  # what is given is never the exercise itself
                    for line in "".join(full["cells"][i]["source"]).splitlines():
                        if line.startswith(("def ", "class ")) and line in given:
                            attempt = next(e.attempt for e in blocks if i in e.solution)
                            assert line not in "".join(full["cells"][attempt]["source"]), \
                                f"{target.name}: the given cell hands out {line!r}, which the reader writes"


def _md(text):
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(text, tags=()):
    return {"cell_type": "code", "execution_count": 1, "metadata": {"tags": list(tags)} if tags else {},
            "outputs": [{"output_type": "stream", "name": "stdout", "text": "x\n"}], "source": text}


def _nb(cells):
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 4}


START_MD, END_MD = "```{solution-start} ex-add\n:class: dropdown\n```", "```{solution-end}\n```"


def test_a_solution_block_is_replaced_by_a_note_and_the_helpers_the_checks_need(tmp_path):
    nb = _nb([_code("import math"), _md("```{exercise} Add\n```"),
              _code("def add(a, b):\n    raise NotImplementedError('your add here')"),
              _md(START_MD),
              _code("def add(a, b):\n    return a + b\n\n\ndef secret(a):\n    return a\n\n\ndef helper(x):\n    return x"),
              _md(END_MD),
              _code("assert add(1, 2) == helper(3)")])
    student = student_notebook(nb)
    sources = [c["source"] for c in student["cells"]]
    assert sources[:3] == [nb["cells"][i]["source"] for i in range(3)]
    assert "Your turn" in sources[3] and "ex-add" in sources[3]
    assert "def helper(x)" in sources[4] and "def add" not in sources[4] and "secret" not in sources[4]
    assert sources[5] == "assert add(1, 2) == helper(3)"
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in student["cells"] if c["cell_type"] == "code")
    nbformat.validate(nbformat.reads(json.dumps(student), as_version=4))

    path = tmp_path / "lab.ipynb"
    path.write_text(json.dumps(nb))
    from utils.student_edition import tag_solutions
    assert tag_solutions(path) == 1 and tag_solutions(path) == 0  # idempotent
    tagged = json.loads(path.read_text())
    assert tagged["cells"][4]["metadata"]["tags"] == [SOLUTION_TAG]
    assert [c["source"] for c in tagged["cells"]] == [c["source"] for c in nb["cells"]]


def test_an_exercise_with_no_attempt_gets_a_stub():
    nb = _nb([_md("```{exercise} Add\n```"), _md(START_MD), _code("def add(a, b):\n    return a + b"), _md(END_MD),
              _code("assert add(1, 2) == 3")])
    stub = student_notebook(nb)["cells"][1]
    assert stub["cell_type"] == "code" and "raise NotImplementedError" in stub["source"]
    namespace: dict = {}
    exec(stub["source"], namespace)
    with pytest.raises(NotImplementedError, match="your turn: write add"):
        namespace["add"](1, 2)


@pytest.mark.parametrize("cells, message", [
    ([_md(START_MD), _md(START_MD), _md(END_MD)], "solution-start inside the block"),
    ([_md(END_MD)], "solution-end with no solution-start"),
    ([_md(START_MD), _code("x = 1")], "never closed"),
])
def test_broken_solution_blocks_are_refused(cells, message):
    with pytest.raises(ValueError, match=message):
        exercises(_nb(cells))
