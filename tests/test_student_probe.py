"""utils.student_probe: the student edition checked inside the full lab's execution, one fork per exercise."""

from __future__ import annotations

import os

import nbformat
import pytest
from nbclient import NotebookClient

from utils import student_probe
from utils.student_probe import Probe, plan, problems, reader_error, widget_only

START = "```{solution-start} ex-add\n:class: dropdown\n```"
END = "```{solution-end}\n```"
ATTEMPT = "def add(a, b):\n    raise NotImplementedError('your add here')"
SOLUTION = "def add(a, b):\n    return a + b\n\n\ndef helper(x):\n    return x"
KERNEL_ENV = {"OMP_NUM_THREADS": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}


def _lab(*cells) -> dict:
    """A notebook: a string is a code cell, ("md", text) a markdown cell, (source, tags) a tagged code cell."""
    made = []
    for cell in cells:
        if isinstance(cell, tuple) and cell[0] == "md":
            made.append(nbformat.v4.new_markdown_cell(cell[1]))
        elif isinstance(cell, tuple):
            made.append(nbformat.v4.new_code_cell(cell[0], metadata={"tags": list(cell[1])}))
        else:
            made.append(nbformat.v4.new_code_cell(cell))
    return nbformat.v4.new_notebook(cells=made)


def _add_lab(check: str = "assert add(1, 2) == helper(3)\nprint('checked', add(2, 2))") -> dict:
    return _lab(
        "import random\nrandom.seed(0)\ncalls = []",
        ("md", "```{exercise} Add\n```"),
        ATTEMPT,
        ("md", START),
        (SOLUTION, ["solution"]),
        ("md", END),
        "import os\ncalls.append('check')\nprint('at the check')\nos.write(1, b'at the check, through fd 1\\n')\n"
        + check,
        "print(calls, random.random(), get_ipython().execution_count)",
    )


def _run(nb: dict, probes: list[Probe], tmp_path) -> tuple[nbformat.NotebookNode, list]:
    nb = nbformat.from_dict(nb)
    client = NotebookClient(nb, timeout=60, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    results: list = []
    with student_probe.probing(probes, results):
        client.execute(env={**os.environ, **KERNEL_ENV})
    return nb, results


def _texts(nb) -> list[str]:
    return ["".join(o.get("text", "") for o in c.outputs) for c in nb.cells if c.cell_type == "code"]


def test_a_plan_probes_before_the_solution_and_runs_the_student_edition_from_there():
    (probe,) = plan(_add_lab())
    assert probe.label == "ex-add" and probe.at == 4 and probe.cell == SOLUTION and probe.hint is None
    # the student edition from the exercise on: the helper the check needs is given, then the cells below
    assert "def helper(x)" in probe.sources[0] and "def add" not in probe.sources[0]
    assert probe.sources[1].startswith("import os\ncalls.append") and probe.sources[2].startswith("print(calls")


def test_a_caught_exercise_passes_and_the_lab_runs_as_without_the_probe(tmp_path):
    lab = _add_lab()
    probes = plan(lab)
    probed, results = _run(lab, probes, tmp_path)
    plain, _ = _run(lab, [], tmp_path)
    assert [(p.label, r["ran"], r["error"]["ename"]) for p, r in results] == [("ex-add", 1, "NotImplementedError")]
    assert student_probe.check_run("lab.ipynb", results, probes) == []
    # the kernel's state, its random generator and every output are those of a run without the probe;
    # nothing the child printed reaches the notebook, and the execution counts are unbroken
    assert _texts(probed) == _texts(plain) and "['check'] 0.8444218515250481 6" in _texts(probed)[-1]
    assert [c.execution_count for c in probed.cells if c.cell_type == "code"] == [1, 2, 3, 4, 5]


def test_an_exercise_no_check_calls_is_reported(tmp_path):
    lab = _add_lab(check="assert helper(3) == 3")
    probes = plan(lab)
    _, results = _run(lab, probes, tmp_path)
    (found,) = student_probe.check_run("lab.ipynb", results, probes)
    assert "ex-add: no check ran the reader's code (3 cells" in found


def test_a_cell_failing_for_another_reason_is_reported(tmp_path):
    lab = _add_lab(check="assert missing_name == add(1, 2)")
    probes = plan(lab)
    _, results = _run(lab, probes, tmp_path)
    (found,) = student_probe.check_run("lab.ipynb", results, probes)
    # the full lab fails too, at that cell: the probe runs first, and says which cell and why
    assert "fails for another reason than the reader's code: NameError" in found and "'import os'" in found


def test_a_known_mistake_must_get_its_hint(tmp_path, monkeypatch):
    check = ("from utils.hints import assert_close\nimport torch\n"
             "assert_close(torch.tensor([float(add(i, 2)) for i in range(1, 9)]),\n"
             "             torch.arange(3.0, 11.0), lab='q-learning-and-reinforce')")
    lab = _add_lab(check=check)
    sign = student_probe.mistakes()["02-q-learning-and-reinforce"][3]
    monkeypatch.setattr(student_probe, "mistakes", lambda: {"lab": ("ex-add", "a + b", "-(a + b)", sign)})
    probes = plan(lab, "lab")
    assert [p.hint for p in probes] == [None, sign] and probes[1].sources[0].startswith("def add(a, b):\n    return -(a")
    _, results = _run(lab, probes, tmp_path)
    assert student_probe.check_run("lab.ipynb", results, probes) == []
    monkeypatch.setattr(student_probe, "mistakes", lambda: {"lab": ("ex-add", "a + b", "a * 1 + b", sign)})
    probes = plan(lab, "lab")  # a mistake the check does not catch at all
    _, results = _run(lab, probes, tmp_path)
    (found,) = student_probe.check_run("lab.ipynb", results, probes)
    assert "with its known mistake: no check ran the reader's code" in found
    monkeypatch.setattr(student_probe, "mistakes", lambda: {"lab": ("ex-add", "a - b", "b - a", sign)})
    with pytest.raises(ValueError, match="no longer in the solution"):
        plan(lab, "lab")


def test_a_hung_child_is_killed_and_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(student_probe, "PROBE_TIMEOUT", 1.0)
    lab = _add_lab(check="import time\ntime.sleep(600)")
    probes = plan(lab)
    lab["cells"][6]["source"] = "calls.append('check')"  # the full lab's own check does not hang
    _, results = _run(lab, probes, tmp_path)
    assert results[0][1] == {"timeout": True}
    assert "ran past 1 s" in problems(probes[0], results[0][1])[0]


def test_a_probe_whose_cell_moved_is_reported(tmp_path):
    lab = _add_lab()
    (probe,) = plan(lab)
    moved = Probe(probe.label, probe.at - 2, probe.cell, probe.sources)
    _, results = _run(lab, [moved], tmp_path)
    assert "is not the solution cell it expected" in problems(moved, results[0][1])[0]
    assert "its probe never ran" in student_probe.check_run("lab.ipynb", [], [probe])[0]


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
    for stem, (label, _, _, hint) in known.items():
        assert hint, stem
        assert sum(p.hint == hint for p in student_probe.lab_probes(stems[stem])) == 1, stem
