"""utils.student_probe: the student edition checked inside the full lab's execution, one fork per exercise.

One small lab holds one exercise of each kind; it runs twice, with its probes and without them.
"""

from __future__ import annotations

import json
import os

import nbformat
import pytest
from nbclient import NotebookClient

from utils import student_probe
from utils.student_probe import Probe, plan, problems, reader_error, widget_only

CHECK_WITH_HINT = (
    "from utils.hints import assert_close\n"
    "assert_close(torch.tensor([float(add(i, 2)) for i in range(1, 9)]), torch.arange(3.0, 11.0),\n"
    "             lab='q-learning-and-reinforce')"
)


def _exercise(label: str, attempt: str, solution: str, check: str) -> list:
    return [("md", "```{exercise} " + label + "\n```"), attempt, ("md", "```{solution-start} " + label + "\n```"),
            (solution, ["solution"]), ("md", "```{solution-end}\n```"), check]


def _lab() -> dict:
    """Exercises: ex-add caught by its check (and a known mistake of it caught with its hint), ex-name whose
    check fails for another reason, ex-hang whose student check hangs, ex-none last, which no check calls."""
    cells = ["import os, random, time\nimport torch\nrandom.seed(0)\ncalls = []"]
    cells += _exercise("ex-add", "def add(a, b):\n    raise NotImplementedError('your add here')",
                       "def add(a, b):\n    return a + b\n\n\ndef helper(x):\n    return x",
                       "calls.append('check')\nprint('at the check')\nos.write(1, b'at the check, through fd 1\\n')\n"
                       + CHECK_WITH_HINT)
    cells += _exercise("ex-name", "def name():\n    raise NotImplementedError", "def name():\n    return 'x'",
                       "assert missing_name == name()")  # fails in the full lab too (allow_errors)
    cells += _exercise("ex-hang", "def triple(x):\n    raise NotImplementedError", "def triple(x):\n    return 3 * x",
                       "try:\n    triple(1)\nexcept NotImplementedError:\n    time.sleep(600)  # the student's run only")
    cells += _exercise("ex-none", "def double(x):\n    raise NotImplementedError", "def double(x):\n    return 2 * x",
                       "assert helper(2) == 2  # never calls double")
    cells.append("print(calls, random.random(), get_ipython().execution_count)")
    made = []
    for cell in cells:
        if isinstance(cell, tuple) and cell[0] == "md":
            made.append(nbformat.v4.new_markdown_cell(cell[1]))
        elif isinstance(cell, tuple):
            made.append(nbformat.v4.new_code_cell(cell[0], metadata={"tags": list(cell[1])}))
        else:
            made.append(nbformat.v4.new_code_cell(cell))
    return nbformat.v4.new_notebook(cells=made)




def _run(nb: dict, probes: list[Probe], tmp_path) -> tuple[nbformat.NotebookNode, list]:
    nb = nbformat.from_dict(nb)
    client = NotebookClient(nb, timeout=60, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    results: list = []
    with student_probe.probing(probes, results):
        client.execute(env={**os.environ, "OMP_NUM_THREADS": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"})
    return nb, results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The lab's probes, and its runs with and without them (the probes' time limit 5 s, for ex-hang)."""
    sign = student_probe.mistakes()["02-q-learning-and-reinforce"][3]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(student_probe, "mistakes", lambda: {"lab": ("ex-add", "a + b", "-(a + b)", sign)})
        patch.setattr(student_probe, "PROBE_TIMEOUT", 5.0)
        lab = _lab()
        probes = plan(lab, "lab")
        add = probes[0]
        moved = Probe("ex-moved", add.at - 2, add.cell, add.sources)  # a cell that is not the solution
        tmp = tmp_path_factory.mktemp("lab")
        probed, results = _run(lab, probes + [moved], tmp)
        plain, _ = _run(lab, [], tmp)
    return {"probes": probes, "moved": moved, "results": results, "probed": probed, "plain": plain, "sign": sign}


def _problems(runs, label: str, hinted: bool = False) -> list[str]:
    return [p for probe, result in runs["results"] if probe.label == label and bool(probe.hint) == hinted
            for p in problems(probe, result)]


def test_a_plan_probes_before_each_solution_and_runs_the_student_edition_from_there(runs):
    add, mistake = runs["probes"][:2]
    assert [p.label for p in runs["probes"]] == ["ex-add", "ex-add", "ex-name", "ex-hang", "ex-none"]
    assert add.at == 4 and add.cell.startswith("def add(a, b):\n    return a + b") and add.hint is None
    # the student edition from the exercise on: the helper the check needs is given, then the cells below
    assert "def helper(x)" in add.sources[0] and "def add" not in add.sources[0]
    assert add.sources[1].startswith("calls.append") and add.sources[2].startswith("def name():")  # ex-name's attempt
    assert mistake.hint == runs["sign"] and mistake.sources[0].startswith("def add(a, b):\n    return -(a + b)")
    assert mistake.sources[1] == add.sources[1]


def test_a_caught_exercise_and_its_known_mistake_pass(runs):
    assert _problems(runs, "ex-add") == [] and _problems(runs, "ex-add", hinted=True) == []
    add, mistake = runs["probes"][:2]
    result, hinted = ([r for p, r in runs["results"] if p is probe] for probe in (add, mistake))
    (result,), (hinted,) = result, hinted
    assert result["ran"] == 1 and result["error"]["ename"] == "NotImplementedError"
    assert hinted["error"]["ename"] == "CheckFailed" and runs["sign"] in hinted["error"]["evalue"]


def test_the_lab_runs_as_without_the_probes(runs):
    # the kernel's state, its random generator, its execution count and every output are those of a run without
    # the probes; nothing a child printed (through sys.stdout or fd 1) reaches the notebook
    texts = [["".join(o.get("text", "") for o in c.outputs) for c in nb.cells if c.cell_type == "code"]
             for nb in (runs["probed"], runs["plain"])]
    assert texts[0] == texts[1]
    assert texts[0][-1] == "['check'] 0.8444218515250481 15\n"


def test_a_cell_failing_for_another_reason_is_reported(runs):
    (found,) = _problems(runs, "ex-name")
    assert "the cell starting 'assert missing_name == name()' fails for another reason than the reader's code: " \
           "NameError" in found


def test_a_hung_student_run_is_killed_and_reported(runs):
    assert [r for p, r in runs["results"] if p.label == "ex-hang"] == [{"timeout": 5.0}]
    assert _problems(runs, "ex-hang") == ["exercise ex-hang: the student edition's cells ran past 5 s"]


def test_an_exercise_no_check_calls_is_reported(runs):
    (found,) = _problems(runs, "ex-none")
    assert found.startswith("exercise ex-none: no check ran the reader's code (2 cells")


def test_a_probe_in_the_wrong_place_or_never_run_is_reported(runs):
    moved = runs["moved"]
    assert [r for p, r in runs["results"] if p is moved] == [{"misplaced": moved.at}]
    assert "is not the solution cell it expected" in problems(moved, {"misplaced": moved.at})[0]
    (never,) = student_probe.check_run("lab.ipynb", [], runs["probes"][:1])
    assert never == "lab.ipynb: student edition: exercise ex-add: its probe never ran (cell 4 was not executed)"


def test_a_known_mistake_without_its_hint_is_reported(runs):
    mistake = runs["probes"][1]
    other = {"ran": 1, "error": {"ename": "CheckFailed", "evalue": "element [0] differs\nHint: another"}}
    assert "did not give the hint" in problems(mistake, other)[0]
    assert "with its known mistake: no check ran" in problems(mistake, {"ran": 7, "error": None})[0]
    with pytest.raises(ValueError, match="no longer in the solution"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(student_probe, "mistakes", lambda: {"lab": ("ex-add", "a - b", "b - a", "hint")})
            plan(_lab(), "lab")


def test_a_kernel_that_cannot_fork_skips_its_probes_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(student_probe.sys, "platform", "darwin")
    assert "macOS" in student_probe.fork_unsafe()
    result = tmp_path / "r.json"
    student_probe.run_in_fork(["raise SystemExit('must not run')"], str(result))
    assert json.loads(result.read_text()) == {"skipped": student_probe.fork_unsafe()}
    assert problems(Probe("ex", 0, "", ("x",)), {"skipped": "why"}) == []  # reported by the caller, not failed
    assert student_probe.skipped([(None, {"skipped": "why"}), (None, {"ran": 1, "error": None})]) == {"why"}
    monkeypatch.delattr(student_probe.os, "fork")
    assert student_probe.fork_unsafe() == "no fork() on darwin"


def test_reader_errors_and_others():
    assert reader_error("NotImplementedError", "your turn")
    assert reader_error("CheckFailed", "element [0] is 1, expected 2\nHint: a sign")
    assert not reader_error("CheckFailed", "a bare assertion")
    assert reader_error("WorkerError", "rank 1 raised:\nNotImplementedError: your turn")
    assert not reader_error("WorkerError", "rank 1 raised:\nZeroDivisionError")
    assert not reader_error("NameError", "name 'x' is not defined")


def test_only_a_lone_explore_expression_is_skipped():
    assert widget_only("viz.explore(plot, n=(1, 8))")
    assert widget_only("# the widget\nviz.explore(\n    plot,\n    n=[1, 2],\n)\n")
    assert not widget_only("w = viz.explore(plot, n=(1, 8))")  # defines w
    assert not widget_only("x = 1\nviz.explore(plot, n=(1, 8))")
    assert not widget_only("viz.live(plot, n=(1, 8))")
    assert not widget_only("explore(plot)") and not widget_only("viz.explore(")


def test_every_labs_known_mistake_names_a_hint_and_an_exercise_of_its_lab():
    from utils.student_edition import labs

    known = student_probe.mistakes()
    stems = {p.stem: p for p in labs()}
    assert set(known) <= set(stems)
    for stem, (_, _, _, hint) in known.items():
        assert hint, stem
        assert sum(p.hint == hint for p in student_probe.lab_probes(stems[stem])) == 1, stem
