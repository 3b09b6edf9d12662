"""Hygiene of the stored notebooks: listed in the TOC, fully executed in order, no errors, lean."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p for folder in ("chapters", "labs") for p in (ROOT / folder).rglob("*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts)
MAX_NBYTES = 1_500_000
# A cell that makes a live ipywidgets control (viz.live is an ipywidgets.interactive).
LIVE_WIDGET = re.compile(r"viz\.live\(|\binteractive\(|\binteract\(")
# Notebooks whose kernel-free twin of a live widget is still to be added (issue 13); empty this set when done.
EXPLORE_PENDING: set[str] = set()


def _toc_files(node) -> list[str]:
    files = []
    if isinstance(node, dict):
        if "file" in node:
            files.append(node["file"])
        for value in node.values():
            files += _toc_files(value)
    elif isinstance(node, list):
        for item in node:
            files += _toc_files(item)
    return files


TOC = _toc_files(yaml.safe_load((ROOT / "_toc.yml").read_text()))


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found under chapters/ or labs/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_in_the_toc(path):
    entry = str(path.relative_to(ROOT).with_suffix(""))
    assert entry in TOC, f"{entry} is missing from _toc.yml"


@pytest.mark.parametrize("entry", TOC)
def test_toc_entry_exists(entry):
    candidates = [ROOT / (entry + ext) for ext in ("", ".md", ".ipynb")]
    assert any(p.is_file() for p in candidates), f"_toc.yml lists {entry}, which does not exist"


def _skipped(cell) -> bool:
    return "skip-execution" in cell["metadata"].get("tags", [])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_live_widget_cells_are_not_executed_by_the_book_build(path):
    """Executing an Output widget under nbclient can lose a reply for a whole cell timeout (README)."""
    nb = json.loads(path.read_text())
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        if LIVE_WIDGET.search(source):
            assert _skipped(cell), f"{path.name} cell {index} makes a live widget; tag it skip-execution"
        if _skipped(cell):
            assert not re.search(r"^(import |from )", source, re.M), \
                f"{path.name} cell {index} is skipped by the book build but imports something; move the import up"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_every_live_widget_also_works_with_no_kernel(path):
    """The next code cell after a viz.live cell is a viz.explore cell, run by the book build, its widget stored."""
    if str(path.relative_to(ROOT)) in EXPLORE_PENDING:
        pytest.skip("its viz.explore cells are still to be added (EXPLORE_PENDING)")
    nb = json.loads(path.read_text())
    code = [(i, c) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]
    for (index, cell), following in zip(code, code[1:] + [(None, None)]):
        if "viz.live(" not in "".join(cell["source"]):
            continue
        assert following[1] is not None and "viz.explore(" in "".join(following[1]["source"]), \
            f"{path.name} cell {index} is a viz.live widget; follow it with a viz.explore cell (same plot function)"
        tags = following[1]["metadata"].get("tags", [])
        assert not {"skip-execution", "remove-output"} & set(tags), \
            f"{path.name} cell {following[0]}: a viz.explore cell must run and show in the HTML; drop {tags}"
        html = ["".join(o.get("data", {}).get("text/html", "")) for o in following[1].get("outputs", [])]
        assert any('class="viz-explore"' in h for h in html), \
            f"{path.name} cell {following[0]} stores no viz.explore widget; re-execute the notebook"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_stored_executed_in_order_without_errors(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    counts = [c.get("execution_count") for c in code]
    assert None not in counts, f"{path.name}: {counts.count(None)} code cells were never executed"
    assert counts == list(range(1, len(code) + 1)), \
        f"{path.name}: execution counts {counts} show it was not run top to bottom in a fresh kernel"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: stores an error output: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    assert path.stat().st_size <= MAX_NBYTES, f"{path.name} is {path.stat().st_size} bytes; shrink its outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_nbval_markers_are_cell_tags_not_comments(path):
    """Readers of the HTML should not see test plumbing: nbval reads the tags nbval-check-output etc."""
    nb = json.loads(path.read_text())
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            marker = re.search(r"^\s*# ?NBVAL_[A-Z_]+", "".join(cell["source"]), re.M)
            assert not marker, f"{path.name} cell {index}: {marker.group().strip()!r} as a comment; use the tag " \
                               f"{marker.group().strip().lstrip('# ').lower().replace('_', '-')!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_checked_cells_store_what_they_check(path):
    nb = json.loads(path.read_text())
    for index, cell in enumerate(nb["cells"]):
        tags = cell["metadata"].get("tags", [])
        if "nbval-check-output" in tags:
            assert cell.get("outputs"), f"{path.name} cell {index} is tagged nbval-check-output but stores no output"
            assert "nbval-ignore-output" not in tags, f"{path.name} cell {index} both checks and ignores its output"


LABS = [p for p in NOTEBOOKS if p.relative_to(ROOT).parts[0] == "labs"]
# Labs whose solution cells are not tagged yet (being edited elsewhere); tag them with
# `python -m utils.student_edition --tag NB` and empty this list.
SOLUTION_TAGS_PENDING: set[str] = set()


@pytest.mark.parametrize("path", LABS, ids=_ids(LABS))
def test_lab_solution_cells_are_tagged_for_the_student_edition(path):
    """`make student` drops the cells tagged `solution`: exactly the code cells of every solution-start/end block."""
    from utils.student_edition import SOLUTION_TAG, exercises

    nb = json.loads(path.read_text())
    blocks = exercises(nb)
    assert blocks, f"{path.name}: a lab has at least one exercise with its solution between solution-start/end"
    inside = {i for e in blocks for i in e.solution}
    tagged = {i for i, c in enumerate(nb["cells"]) if SOLUTION_TAG in c["metadata"].get("tags", [])}
    if str(path.relative_to(ROOT)) in SOLUTION_TAGS_PENDING and not tagged:
        pytest.skip("solution tags pending for this lab (SOLUTION_TAGS_PENDING)")
    assert tagged == inside, f"{path.name}: code cells of solution blocks {sorted(inside)} but cells tagged " \
                             f"{SOLUTION_TAG!r} {sorted(tagged)}"
    for e in blocks:
        assert e.solution, f"{path.name}: solution block {e.label} has no code cell"
        assert e.attempt is not None, f"{path.name}: exercise {e.label} has no attempt cell before its solution"


# A reader's prediction (my_x = ..., MY_PREDICTION = {...}, my_a, my_b = ..., my_p["k"] = ...) starts as None.
PREDICTION_NAME = re.compile(r"^(my|MY)_")


def _assigned_names(target: ast.expr) -> list[str]:
    """The variables an assignment target writes to: ``my_p`` for ``my_p``, ``my_p["k"]`` and ``my_p.k``."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _assigned_names(element)]
    if isinstance(target, ast.Starred):
        return _assigned_names(target.value)
    if isinstance(target, (ast.Subscript, ast.Attribute)):
        return _assigned_names(target.value)
    return []


def _numbers_in(value: ast.expr) -> list[str]:
    """Numeric literals in an assigned value, anywhere in it (dict keys aside), however many lines it spans."""
    found = []
    for node in ast.walk(value):
        if isinstance(node, ast.Dict):
            for key in node.keys:  # a key names a prediction; only the values are guesses
                if isinstance(key, ast.Constant):
                    key.value = None
        if isinstance(node, ast.Constant) and type(node.value) in (int, float, complex):
            found.append(repr(node.value))
    return found


def prefilled_predictions(source: str) -> list[str]:
    """``name = value`` for every assignment of a number to a ``my_``/``MY_`` variable in a code cell's source."""
    code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    problems = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            targets = [node.target]
        else:
            continue
        names = [n for target in targets for n in _assigned_names(target) if PREDICTION_NAME.match(n)]
        numbers = _numbers_in(node.value) if names else []
        if numbers:
            problems.append(f"{names[0]} = ... {', '.join(numbers)} ...")
    return problems


def test_prefilled_predictions_are_found_in_every_form():
    assert prefilled_predictions("my_guess = 3") == ["my_guess = ... 3 ..."]
    assert prefilled_predictions("my_prediction = {\n    'a': None,\n    'b': 1e-8,  # a guess\n}")
    assert prefilled_predictions("my_a, my_b = None, -2")
    assert prefilled_predictions("my_p = dict(x=None)\nmy_p['x'] = 0.5")
    assert prefilled_predictions("MY_PREDICTION: float = 4.0")
    assert prefilled_predictions("my_list = [None,\n           2]")
    assert not prefilled_predictions("my_prediction = {'GPUs at 8': None, 'x': None}  # 8 in a comment")
    assert not prefilled_predictions("my_prediction = {8: None, 'text 3': None}")  # keys are names
    assert not prefilled_predictions("x = 3\nmy_answer = None\n%timeit f(3)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_predictions_start_as_none(path):
    """CONVENTIONS.md: a prediction the reader is asked to make starts as None, never as a number."""
    nb = json.loads(path.read_text())
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        problems = prefilled_predictions("".join(cell["source"]))
        assert not problems, f"{path.name} cell {index}: {problems}; start every prediction as None"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_sources_have_no_control_characters(path):
    """A LaTeX backslash eaten by a Python string (\\a, \\b, \\f ...) leaves a control character behind."""
    nb = json.loads(path.read_text())
    for index, cell in enumerate(nb["cells"]):
        bad = re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", "".join(cell["source"]))
        assert not bad, f"{path.name} cell {index}: control character {bad.group()!r} in its source"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_stored_outputs_have_no_progress_bar_frames(path):
    """A text progress bar stored by an unattended run leaves carriage-return frames in the page.

    utils.progress prints one line instead when BOOK_BATCH_EXECUTION=1 (the Makefile sets it).
    """
    nb = json.loads(path.read_text())
    for index, cell in enumerate(nb["cells"]):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                text = "".join(output["text"])
                assert "\r" not in text and "it/s]" not in text, (
                    f"{path.name} cell {index}: a progress bar's frames in a stored output: {text[:80]!r}")


_TRITON_LAUNCH = re.compile(r"utils\.kernels|_kernel\[|\bmy_\w+\(|_triton\(")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_gpu_cells_that_launch_triton_check_for_triton(path):
    """A cell that runs Triton kernels on CUDA tensors is guarded by device.TRITON_ON_GPU (or require_triton).

    device.HAS_CUDA alone is not enough: Windows with an NVIDIA GPU has CUDA but no Triton wheel.
    """
    nb = json.loads(path.read_text())
    for index, cell in enumerate(nb["cells"]):
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and 'device="cuda"' in source and _TRITON_LAUNCH.search(source):
            assert "TRITON_ON_GPU" in source or "require_triton" in source, (
                f"{path.name} cell {index}: launches Triton on CUDA tensors; guard it with device.TRITON_ON_GPU")
