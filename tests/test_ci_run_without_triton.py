""".ci/run_without_triton.py: a notebook run as on macOS or Windows, with ``import triton`` failing.

A tiny notebook in a real kernel, in a subprocess: the page's pattern (``triton`` or the stand-ins of
``utils.no_triton``, a kernel defined, its launch guarded by ``device.require_triton``) runs to the end;
an unguarded launch fails the run, naming the notebook.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "run_without_triton.py"

SETUP = """\
import torch
import utils
from utils import device

if device.HAS_TRITON:
    import triton
    import triton.language as tl
else:
    from utils.no_triton import tl, triton


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)
"""
GUARDED = """\
if device.require_triton("Running copy_kernel"):
    x = torch.ones(8)
    copy_kernel[(1,)](x, torch.empty_like(x), 8, BLOCK_SIZE=8)
"""
UNGUARDED = "copy_kernel[(1,)](torch.ones(8), torch.empty(8), 8, BLOCK_SIZE=8)\n"


def _run(tmp_path: Path, *cells: str) -> subprocess.CompletedProcess:
    path = tmp_path / "page.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    done = subprocess.run([sys.executable, str(SCRIPT), "--timeout", "120", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert nbformat.read(path, as_version=4).cells[0].outputs == [], "the notebook on disk was written"
    return done


def test_a_guarded_page_runs_to_the_end_without_triton(tmp_path):
    done = _run(tmp_path, SETUP, 'assert not device.HAS_TRITON, "triton was importable"\n', GUARDED)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok" in done.stdout and "page.ipynb" in done.stdout


def test_an_unguarded_launch_fails_the_run_saying_why(tmp_path):
    done = _run(tmp_path, SETUP, UNGUARDED)
    assert done.returncode == 1
    assert "FAILED" in done.stdout and "copy_kernel is a Triton kernel and cannot run here" in done.stderr
