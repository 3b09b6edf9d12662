"""benchmarks.gpu_session: the steps of one GPU lease, smoke-tested on the CPU (no sweep there)."""

import json
import tarfile
from pathlib import Path

from benchmarks import gpu_session

ROOT = Path(__file__).resolve().parent.parent


def test_env_and_notebooks_steps_write_their_files(tmp_path, monkeypatch):
    notebook = tmp_path / "tiny.ipynb"
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {}, "source": "print(6 * 7)",
                                               "outputs": [], "execution_count": None}],
                                    "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    out = tmp_path / "out"
    code = gpu_session.main(["--out", str(out), "--allow-cpu", "--steps", "env", "notebooks", "--deadline", "120",
                             "--jobs", "1", "--notebooks", str(notebook)])
    assert code == 0
    assert "gpu_session: env ok, notebooks ok" in (out / "session.log").read_text()
    assert "1 of 1 notebooks ran without error" in (out / "notebooks.txt").read_text()
    with tarfile.open(out / "notebook-logs.tar.gz") as tar:
        assert any("tiny.ipynb" in name for name in tar.getnames())


def test_a_step_past_the_deadline_is_skipped_not_hung(tmp_path):
    with open(tmp_path / "log", "w") as log:
        assert gpu_session._run(["python", "-c", "print(1)"], log, deadline=0.0) == 124


def test_the_production_step_packs_part_6_recordings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "benchmarks").symlink_to(ROOT / "benchmarks")
    (tmp_path / "utils").symlink_to(ROOT / "utils")
    out = tmp_path / "out"
    code = gpu_session.main(["--out", str(out), "--allow-cpu", "--steps", "production", "--deadline", "120"])
    assert code == 0
    with tarfile.open(out / "production.tar.gz") as tar:
        assert {"step-trace.json.gz", "summary.txt"} <= set(tar.getnames())
    assert "need a CUDA GPU" in (out / "session.log").read_text()
