"""The student edition of the labs (`make student`) fails at the checks, and nowhere else.

Each lab's student edition (:func:`utils.student_edition.student_notebook`) is
executed cell by cell in one kernel. Before the first exercise every cell must
pass. A cell that fails after an exercise must fail because of the reader's
unwritten code: a ``NotImplementedError`` from an attempt, or a
:class:`utils.hints.CheckFailed` with its hint (raised in a worker process, the
same inside a ``WorkerError``). The test then runs the reference solutions of
the exercises seen so far, as a reader who solved them would, and runs the
failing cell again: it must now pass (the full lab's direction). Every exercise
must have been caught by a check. For a few labs a known mistake is tried first
(:data:`MISTAKES`): the check must fail with the hint that names it.

To stay cheap the run stops once the last exercise's check has passed; the
measurements after it are nbval's job on the full labs. Cells tagged
``skip-execution`` (live widgets) are skipped, as in the book build, and so are
cells that only draw a kernel-free widget (one ``viz.explore(...)`` expression):
its frames are drawn, from the same code, when ``make test`` executes the full lab,
and a check, not a picture, must catch the reader's unwritten code.
"""

from __future__ import annotations

import ast
import json
import os
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from utils.capstone.assemble_check import HINTS as ASSEMBLE_HINTS
from utils.capstone.grpo_check import HINTS as GRPO_HINTS
from utils.hints import MISTAKES as HINT_TABLES
from utils.production.slow_step import HINTS as SLOW_STEP_HINTS
from utils.student_edition import GIVEN_TAG, SOLUTION_TAG, build, exercises, labs, student_notebook

ROOT = Path(__file__).resolve().parent.parent
LABS = labs(ROOT)
TIMEOUT = 300  # seconds per cell
# The kernels' environment, as `make` sets it (Makefile), so that running this file directly with pytest
# gives the same run: one thread per kernel (two labs run at once on 2 workers), and utils.progress's
# one-line progress instead of a live bar.
KERNEL_ENV = {"OMP_NUM_THREADS": "1", "BOOK_BATCH_EXECUTION": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}

# lab stem -> (exercise label, text in its solution, the mistake put in its place, text the hint must contain)
MISTAKES = {
    "04-flash-attention": ("flash-lab-ex-tiled", "out[..., i:i + block, :] = acc / l[..., None]",
                           "out[..., i:i + block, :] = acc", HINT_TABLES["flash-attention"]["row_scaled"]),
    "02-q-learning-and-reinforce": ("qlr-reinforce", "grad[s] += weight * score", "grad[s] -= weight * score",
                                    HINT_TABLES["q-learning-and-reinforce"]["sign"]),
    # the running output not rescaled: the non-causal stage fails first, and its hint is the merge's
    "08-ring-attention": ("ring-lab-forward", "alpha[..., None] * acc.index_select(2, rows)",
                          "acc.index_select(2, rows)", HINT_TABLES["ring-attention"]["some"]),
    # every full block hashed: a prompt found whole in the cache leaves no token to run (the repeated 72 tokens)
    "01-a-serving-engine": ("serving-lab-prefix", "usable = (len(tokens) - 1) // self.block_size",
                            "usable = len(tokens) // self.block_size", HINT_TABLES["serving-prefix-last-token"]["some"]),
    # the schedule's position not restored: the warm-up starts again (the first weights, RMSNorm's, all off by one factor)
    # the optimizer left as a CPU's default: the trace check names it
    "01-profile-find-fix": ("pff-fix", "torch.optim.AdamW(params, lr=1e-3, fused=True)",
                            "torch.optim.AdamW(params, lr=1e-3, foreach=False)", SLOW_STEP_HINTS["unfused optimizer"]),
    # the mean's 1/N left out of the gradient: every element of it N times too large
    "02-fused-linear-cross-entropy": ("flce-kernel", "tl.store(row_ptr + cols, grad * inv_n, mask=mask)",
                                      "tl.store(row_ptr + cols, grad, mask=mask)",
                                      HINT_TABLES["fused-linear-cross-entropy"]["scaled"]),
    "03-crash-and-resume": ("crash-restore", 'schedule.last_epoch = int(state["schedule"])', "schedule.last_epoch = 0",
                            HINT_TABLES["crash-and-resume"]["scaled"]),
    # the TP-replicated gradients summed over the wrong group: step 0's loss is right, step 1's is not
    "01-assemble-a-4d-step": ("a4d-finish", 'dist.all_reduce(zero.shard_of(p).grad, group=groups[("tp",)])',
                              'dist.all_reduce(zero.shard_of(p).grad, group=groups[("cp", "dp")])',
                              ASSEMBLE_HINTS["finish"]),
    # the temperature left out of the CDF: the draws follow softmax(z), and the chi-square test says so
    "02-grpo-with-your-own-engine": ("grpo-lab-draw", "cdf = torch.softmax(row / temperature, -1).cumsum(0)",
                                     "cdf = torch.softmax(row, -1).cumsum(0)", GRPO_HINTS["temperature ignored"]),
}


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


# Labs being edited elsewhere whose checks do not call utils.hints yet (see SOLUTION_TAGS_PENDING in
# test_notebooks.py): a plain AssertionError from their checks is accepted until they do.
HINTS_PENDING: set[str] = set()


def _reader_error(error: CellExecutionError, lab: str) -> bool:
    """True when the error comes from the reader's side: an unwritten attempt or a failed, hinted check."""
    text = f"{error.ename}: {error.evalue}"
    if error.ename == "NotImplementedError":
        return True
    if error.ename == "AssertionError" and lab in HINTS_PENDING:
        return True
    if error.ename == "CheckFailed":
        return "Hint:" in error.evalue or "element" in error.evalue or "the value is" in error.evalue
    if error.ename == "WorkerError":  # a check inside worker processes: the worker's traceback is in the message
        return "NotImplementedError" in text or "CheckFailed" in text
    return False


def widget_only(source: str) -> bool:
    """True for a cell that is one ``viz.explore(...)`` expression: it defines nothing a later cell reads."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    if len(body) != 1 or not isinstance(body[0], ast.Expr) or not isinstance(body[0].value, ast.Call):
        return False
    func = body[0].value.func
    return isinstance(func, ast.Attribute) and func.attr == "explore" and \
        isinstance(func.value, ast.Name) and func.value.id == "viz"


def test_only_a_lone_explore_expression_is_skipped():
    assert widget_only("viz.explore(plot, n=(1, 8))")
    assert widget_only("# the widget\nviz.explore(\n    plot,\n    n=[1, 2],\n)\n")
    assert not widget_only("w = viz.explore(plot, n=(1, 8))")  # defines w
    assert not widget_only("x = 1\nviz.explore(plot, n=(1, 8))")
    assert not widget_only("viz.live(plot, n=(1, 8))")
    assert not widget_only("explore(plot)") and not widget_only("viz.explore(")


def run_student_lab(path: Path) -> dict:
    """Execute the student edition of one lab as described in the module docstring; return what happened."""
    full = json.loads(path.read_text())
    blocks = {e.label: e for e in exercises(full)}
    nb = nbformat.reads(json.dumps(student_notebook(full)), as_version=4)
    markers = {i: c.metadata["student_edition"]["exercise"] for i, c in enumerate(nb.cells)
               if c.metadata.get("student_edition", {}).get("role") == "your-turn"}
    client = NotebookClient(nb, timeout=TIMEOUT, kernel_name="python3", skip_cells_with_tag="skip-execution",
                            resources={"metadata": {"path": str(path.parent)}})
    client.widget_registry = {}
    pending: list[str] = []  # exercises passed whose solutions have not been run
    caught: dict[str, str] = {}  # exercise -> the first line of the error its check raised
    mistake = MISTAKES.get(path.stem)
    mistake_hint = None
    last_marker = max(markers) if markers else -1
    n_cells = len(nb.cells)

    def run_extra(source: str) -> None:
        """Run code that is not a cell of the lab (a solution, a mistake) in the lab's kernel."""
        nb.cells.append(nbformat.v4.new_code_cell(source))
        try:
            client.execute_cell(nb.cells[-1], len(nb.cells) - 1)
        finally:
            nb.cells.pop()

    with client.setup_kernel(env={**os.environ, **KERNEL_ENV}):
        for index, cell in enumerate(nb.cells[:n_cells]):
            if index in markers:
                pending.append(markers[index])
                continue
            if cell.cell_type != "code" or widget_only(cell.source):
                continue
            try:
                client.execute_cell(cell, index)
            except CellExecutionError as error:
                assert pending, f"cell {index} fails before any exercise:\n{error}"
                assert _reader_error(error, path.stem), f"cell {index} fails for another reason than the reader's code:\n{error}"
                for label in pending:
                    caught[label] = f"{error.ename}: {(error.evalue.strip().splitlines() or [''])[0]}"
                if mistake and mistake[0] in pending:
                    label, right, wrong, expected_hint = mistake
                    source = blocks[label].solution_source(full)
                    assert right in source, f"{path.name}: the mistake's text is no longer in the solution"
                    run_extra(source.replace(right, wrong))
                    try:
                        client.execute_cell(cell, index)
                    except CellExecutionError as hinted:
                        mistake_hint = hinted.evalue
                    assert mistake_hint and expected_hint in mistake_hint, \
                        f"cell {index}: the mistake {wrong!r} did not give the hint {expected_hint!r}: {mistake_hint}"
                for label in pending:
                    run_extra(blocks[label].solution_source(full))
                pending = []
                client.execute_cell(cell, index)  # with the reference solutions it must pass
                if index > last_marker:
                    break
    return {"caught": caught, "pending": pending, "mistake_hint": mistake_hint, "exercises": list(blocks)}


@pytest.mark.parametrize("path", LABS, ids=_ids(LABS))
def test_student_lab_fails_at_the_checks_and_nowhere_else(path):
    start = time.perf_counter()
    result = run_student_lab(path)
    missed = [label for label in result["exercises"] if label not in result["caught"]]
    assert not missed, f"{path.name}: no check ran the reader's code for exercises {missed}"
    if path.stem in MISTAKES:
        assert result["mistake_hint"], f"{path.name}: the known mistake was never tried"
    print(f"{path.relative_to(ROOT)}: {time.perf_counter() - start:.1f} s, caught {result['caught']}")
    if result["mistake_hint"]:
        print("  the known mistake's message:", "\n    ".join(result["mistake_hint"].splitlines()[:2]))


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
