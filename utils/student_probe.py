"""The student edition's checks, run inside the execution of the full lab: a fork of the kernel per exercise.

What the student edition (:mod:`utils.student_edition`) must do is fail at the checks and nowhere
else: a reader who runs it top to bottom meets, after each exercise, a check that fails because the
reader's code is not written yet (a ``NotImplementedError`` from the attempt, or a
:class:`utils.hints.CheckFailed` with its hint, also inside a :class:`utils.dist.WorkerError`), and
for a few labs a known mistake (:data:`MISTAKES`) gets the hint that names it.

Running the student edition in a kernel of its own repeats most of the lab, which ``make test``
executes anyway. So the check runs *inside* that execution: just before the first code cell of an
exercise's solution, the kernel forks (:func:`run_in_fork`). The child holds the kernel's state at
that point, with every earlier exercise solved, as a reader who solved them would have it; it runs
the student edition's cells from there (this exercise's stub and given helpers, then the cells
below, later solutions replaced by their stubs the same way) until one raises, and reports the
error. The kernel itself waits, then runs the solution as usual: its state, its random generators
and every output of the lab are the same as without the probe, and the probe's request is silent
(no execution count, no output, no history). :func:`probing` adds the probes to nbclient's
``NotebookClient``, the client the book's build executes notebooks with; :func:`plan` says where
they go and what they run; :func:`problems` reads what came back.

What each probe must see, as the student-edition test asked of a whole student run:

* an error, raised within the cells the child ran: else no check ran the reader's code;
* an error from the reader's side (:func:`reader_error`): else a cell fails for another reason;
* for a mistake probe (the solution with the mistake in place of the stub), the hint that names it.

The cells before the first exercise, and the checks passing once the solutions run, are the full
lab's own execution. Where a kernel cannot fork a usable copy of itself (:func:`fork_unsafe`: Windows,
macOS, a kernel that has initialised CUDA) the probes report themselves skipped, and say why: the
student editions are checked on Linux CPUs, as CI is.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from utils.student_edition import SOLUTION_TAG, exercises, student_notebook

SKIP_TAG = "skip-execution"
PROBE_TIMEOUT = 300.0
"""Seconds a probe's child may run before it is killed (the student-edition test allowed 300 s per cell)."""

# lab stem -> (exercise label, text in its solution, the mistake put in its place, text the hint must contain).
# The hints are looked up when a plan is made (:func:`mistakes`), so importing this module stays light.
_MISTAKES = {
    "04-flash-attention": ("flash-lab-ex-tiled", "out[..., i:i + block, :] = acc / l[..., None]",
                           "out[..., i:i + block, :] = acc", ("hints", "flash-attention", "row_scaled")),
    "02-q-learning-and-reinforce": ("qlr-reinforce", "grad[s] += weight * score", "grad[s] -= weight * score",
                                    ("hints", "q-learning-and-reinforce", "sign")),
    # the running output not rescaled: the non-causal stage fails first, and its hint is the merge's
    "08-ring-attention": ("ring-lab-forward", "alpha[..., None] * acc.index_select(2, rows)",
                          "acc.index_select(2, rows)", ("hints", "ring-attention", "some")),
    # every full block hashed: a prompt found whole in the cache leaves no token to run (the repeated 72 tokens)
    "01-a-serving-engine": ("serving-lab-prefix", "usable = (len(tokens) - 1) // self.block_size",
                            "usable = len(tokens) // self.block_size", ("hints", "serving-prefix-last-token", "some")),
    # the optimizer left as a CPU's default: the trace check names it
    "01-profile-find-fix": ("pff-fix", "torch.optim.AdamW(params, lr=1e-3, fused=True)",
                            "torch.optim.AdamW(params, lr=1e-3, foreach=False)", ("slow_step", "unfused optimizer")),
    # the mean's 1/N left out of the gradient: every element of it N times too large
    "02-fused-linear-cross-entropy": ("flce-kernel", "tl.store(row_ptr + cols, grad * inv_n, mask=mask)",
                                      "tl.store(row_ptr + cols, grad, mask=mask)",
                                      ("hints", "fused-linear-cross-entropy", "scaled")),
    # the schedule's position not restored: the warm-up starts again (the first weights, RMSNorm's, all off by one factor)
    "03-crash-and-resume": ("crash-restore", 'schedule.last_epoch = int(state["schedule"])', "schedule.last_epoch = 0",
                            ("hints", "crash-and-resume", "scaled")),
    # the TP-replicated gradients summed over the wrong group: step 0's loss is right, step 1's is not
    "01-assemble-a-4d-step": ("a4d-finish", 'dist.all_reduce(zero.shard_of(p).grad, group=groups[("tp",)])',
                              'dist.all_reduce(zero.shard_of(p).grad, group=groups[("cp", "dp")])',
                              ("assemble", "finish")),
    # the temperature left out of the CDF: the draws follow softmax(z), and the chi-square test says so
    "02-grpo-with-your-own-engine": ("grpo-lab-draw", "cdf = torch.softmax(row / temperature, -1).cumsum(0)",
                                     "cdf = torch.softmax(row, -1).cumsum(0)", ("grpo", "temperature ignored")),
}


def _hint(where: tuple[str, ...]) -> str:
    """The hint text a mistake's check must contain, from the table of the module that raises it."""
    if where[0] == "hints":
        from utils.hints import MISTAKES as tables

        return tables[where[1]][where[2]]
    if where[0] == "slow_step":
        from utils.production.slow_step import HINTS
    elif where[0] == "assemble":
        from utils.capstone.assemble_check import HINTS
    else:
        from utils.capstone.grpo_check import HINTS
    return HINTS[where[1]]


def mistakes() -> dict[str, tuple[str, str, str, str]]:
    """lab stem -> (exercise label, text in its solution, the mistake put in its place, the hint it must get)."""
    return {stem: (label, right, wrong, _hint(where)) for stem, (label, right, wrong, where) in _MISTAKES.items()}


@dataclass(frozen=True)
class Probe:
    """One fork of the kernel: before full-lab cell ``at``, run ``sources`` until one raises.

    ``hint`` is None for an exercise's probe (the error must come from the reader's side) and the
    text the error must contain for a mistake's probe.
    """

    label: str
    at: int
    cell: str  # the source of full-lab cell ``at``: the client checks it is the cell it is about to run
    sources: tuple[str, ...]
    hint: str | None = None


def widget_only(source: str) -> bool:
    """True for a cell that is one ``viz.explore(...)`` expression: it draws frames and defines nothing.

    The student edition's run skips it: its frames are drawn by the full lab, and a check, not a
    picture, must catch the reader's unwritten code.
    """
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return False
    if len(body) != 1 or not isinstance(body[0], ast.Expr) or not isinstance(body[0].value, ast.Call):
        return False
    func = body[0].value.func
    return isinstance(func, ast.Attribute) and func.attr == "explore" and \
        isinstance(func.value, ast.Name) and func.value.id == "viz"


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _runnable(cell: dict) -> bool:
    """A code cell the student edition's run executes (the book build skips ``skip-execution`` cells too)."""
    return cell["cell_type"] == "code" and bool(_source(cell).strip()) and \
        SKIP_TAG not in cell.get("metadata", {}).get("tags", []) and not widget_only(_source(cell))


def plan(full: dict, lab: str | None = None) -> list[Probe]:
    """The probes of one lab (``full``: the notebook as JSON; ``lab``: its file stem, for :func:`mistakes`).

    An exercise's probe goes before the first code cell of its solution block and runs the student
    edition from that exercise's replacement cells (stub, given helpers) to the end; a mistake's
    probe goes at the same place and runs the solution with the mistake, then the student edition's
    cells after the exercise.
    """
    blocks = exercises(full)
    student = student_notebook(full)["cells"]
    role = [c.get("metadata", {}).get("student_edition", {}) for c in student]
    mistake = mistakes().get(lab) if lab else None
    probes = []
    for block in blocks:
        at = next((k for k in range(block.start + 1, len(full["cells"])) if full["cells"][k]["cell_type"] == "code"),
                  None)
        if at is None:
            raise ValueError(f"exercise {block.label}: no code cell after its solution-start (cell {block.start})")
        first = next(k for k, r in enumerate(role) if r.get("exercise") == block.label)
        after = max(k for k, r in enumerate(role) if r.get("exercise") == block.label) + 1
        cell = _source(full["cells"][at])
        probes.append(Probe(block.label, at, cell, tuple(_source(c) for c in student[first:] if _runnable(c))))
        if mistake and mistake[0] == block.label:
            label, right, wrong, hint = mistake
            solution = block.solution_source(full)
            if right not in solution:
                raise ValueError(f"{lab}: the mistake's text {right!r} is no longer in the solution of {label}")
            probes.append(Probe(label, at, cell, (solution.replace(right, wrong),)
                                + tuple(_source(c) for c in student[after:] if _runnable(c)), hint))
    if mistake and not any(p.hint for p in probes):
        raise ValueError(f"{lab}: no exercise {mistake[0]!r} for its known mistake")
    return probes


def reader_error(ename: str, evalue: str) -> bool:
    """True when an error comes from the reader's side: an unwritten attempt, or a failed check with its hint."""
    if ename == "NotImplementedError":
        return True
    if ename == "CheckFailed":
        return "Hint:" in evalue or "element" in evalue or "the value is" in evalue
    if ename == "WorkerError":  # a check inside worker processes: the worker's traceback is in the message
        return "NotImplementedError" in evalue or "CheckFailed" in evalue
    return False


def problems(probe: Probe, result: dict[str, Any]) -> list[str]:
    """What is wrong with one probe's ``result`` (as :func:`run_in_fork` writes it); empty when it is right."""
    name = f"exercise {probe.label}" + (" with its known mistake" if probe.hint else "")
    if result.get("skipped"):
        return []
    if "misplaced" in result:
        return [f"{name}: cell {result['misplaced']} of the executed notebook is not the solution cell it expected"]
    if result.get("timeout"):
        return [f"{name}: the student edition's cells ran past {result['timeout']:g} s"]
    error = result.get("error")
    if error is None:
        return [f"{name}: no check ran the reader's code ({result.get('ran', 0)} cells of the student edition "
                "ran to the end without an error)"]
    where = probe.sources[result["ran"]].strip().splitlines()[0][:80] if result["ran"] < len(probe.sources) else "?"
    said = f"{error['ename']}: {error['evalue'].strip()[:1500]}"
    if probe.hint is not None:
        if probe.hint not in error["evalue"]:
            return [f"{name}: the check did not give the hint {probe.hint!r}; the cell starting {where!r} raised {said}"]
        return []
    if not reader_error(error["ename"], error["evalue"]):
        return [f"{name}: the cell starting {where!r} fails for another reason than the reader's code: {said}"]
    return []


# ----- in the kernel ---------------------------------------------------------------------------------------------


def fork_unsafe() -> str:
    """Why this process cannot fork a usable copy of itself, or '' where it can (Linux, CUDA not initialised).

    Windows has no ``fork``; on macOS a child forked after Apple's frameworks are loaded (NumPy's
    Accelerate) may crash (the reason ``make test`` forks its kernels on Linux only, ``utils.forked_kernels``);
    CUDA does not survive a fork.
    """
    if not hasattr(os, "fork"):
        return f"no fork() on {sys.platform}"
    if sys.platform == "darwin":
        return "fork() is unsafe on macOS once NumPy's Accelerate is loaded"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in this kernel"
    return ""


def run_in_fork(sources: list[str], result_path: str, timeout: float = PROBE_TIMEOUT) -> None:
    """In a Jupyter kernel: fork, run ``sources`` in the child on the kernel's namespace until one raises.

    Writes ``{"ran": cells run without error, "error": {"ename", "evalue"} or None}`` to ``result_path``
    as JSON (``{"timeout": timeout}`` if the child ran past ``timeout`` seconds and was killed with its
    process group; ``{"skipped": why}`` where a fork cannot work). The kernel's own state is untouched.
    """
    why = fork_unsafe()
    if why:
        Path(result_path).write_text(json.dumps({"skipped": why}))
        return
    from IPython import get_ipython

    shell = get_ipython()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        _child(shell, sources, result_path)
    try:
        os.setpgid(pid, pid)  # also here, so that a timeout right away finds the group (the child does it too)
    except OSError:
        pass
    deadline = time.monotonic() + timeout
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            Path(result_path).write_text(json.dumps({"timeout": timeout}))
            return
        time.sleep(0.02)


def _child(shell: Any, sources: list[str], result_path: str) -> None:
    """The forked child: no output reaches the kernel's sockets, the cells run, the result is written, exit."""
    result: dict[str, Any] = {"ran": 0, "error": None}
    try:
        os.setpgid(0, 0)  # its own process group: a timeout kills the workers it started too
        # The kernel's streams belong to threads the child does not have (ipykernel's IOPub thread, its
        # fd-1 reader): what the child prints goes nowhere rather than into buffers no one drains.
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        sys.stdout = sys.stderr = open(os.devnull, "w")
        shell.display_pub.publish = lambda *args, **kwargs: None
        for index, source in enumerate(sources):
            code = compile(shell.transform_cell(source), f"<student edition cell {index}>", "exec")
            exec(code, shell.user_ns)  # noqa: S102 (the lab's own cells)
            result["ran"] = index + 1
    except BaseException as err:  # noqa: BLE001 (whatever the cell raised is the result)
        result["error"] = {"ename": type(err).__name__, "evalue": str(err)}
    try:
        Path(result_path).write_text(json.dumps(result))
    finally:
        os._exit(0)


# ----- in the client ---------------------------------------------------------------------------------------------


def _probe_code(probe: Probe, result_path: str) -> str:
    return (f"import utils.student_probe as _book_probe\n"
            f"_book_probe.run_in_fork({list(probe.sources)!r}, {result_path!r}, {PROBE_TIMEOUT!r})\n"
            f"del _book_probe")


@contextmanager
def probing(probes: list[Probe], results: list[tuple[Probe, dict]]) -> Iterator[None]:
    """While open, every ``nbclient.NotebookClient`` runs ``probes`` before their cells; results are appended.

    The probe is a silent execute request (no execution count, no history, no output in the notebook);
    the client then executes the cell as it would have.
    """
    from nbclient import NotebookClient

    by_cell: dict[int, list[Probe]] = {}
    for probe in probes:
        by_cell.setdefault(probe.at, []).append(probe)
    original = NotebookClient.async_execute_cell

    async def execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        for probe in by_cell.get(cell_index, []):
            if cell.source != probe.cell:
                results.append((probe, {"misplaced": cell_index}))
                continue
            fd, result_path = tempfile.mkstemp(prefix="book-probe-", suffix=".json")
            os.close(fd)
            try:
                msg_id = self.kc.execute(_probe_code(probe, result_path), silent=True, store_history=False)
                reply = await self.async_wait_for_reply(msg_id)
                content = (reply or {}).get("content", {})
                if content.get("status") != "ok":
                    result = {"ran": 0, "error": {"ename": "ProbeFailed",
                                                  "evalue": f"{content.get('ename')}: {content.get('evalue')}"}}
                else:
                    result = json.loads(Path(result_path).read_text() or "{}")
            finally:
                os.unlink(result_path)
            results.append((probe, result))
        return await original(self, cell, cell_index, execution_count, store_history)

    NotebookClient.async_execute_cell = execute_cell
    try:
        yield
    finally:
        NotebookClient.async_execute_cell = original


def check_run(path: Path, results: list[tuple[Probe, dict]], probes: list[Probe]) -> list[str]:
    """Every probe of ``path`` ran and saw what it must: the problems found, empty when there are none."""
    found = [p for probe, result in results for p in problems(probe, result)]
    ran = {id(probe) for probe, _ in results}
    found += [f"exercise {p.label}: its probe never ran (cell {p.at} was not executed)" for p in probes
              if id(p) not in ran]
    return [f"{path}: student edition: {p}" for p in found]


def skipped(results: list[tuple[Probe, dict]]) -> set[str]:
    """Why probes of a run were skipped (:func:`fork_unsafe`'s reasons); empty when every probe ran."""
    return {result["skipped"] for _, result in results if result.get("skipped")}


def lab_probes(path: Path) -> list[Probe]:
    """:func:`plan` for the notebook at ``path``; empty for a notebook with no exercise (a chapter)."""
    full = json.loads(Path(path).read_text())
    if not any(SOLUTION_TAG in c.get("metadata", {}).get("tags", []) for c in full["cells"]):
        return []
    return plan(full, Path(path).stem)
