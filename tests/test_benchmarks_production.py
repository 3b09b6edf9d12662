"""benchmarks.production_recordings: part 6's GPU recordings, as a CPU smoke test."""

import gzip
import json

from benchmarks import production_recordings
from utils.production.trace_timeline import read_chrome_trace


def test_the_cpu_smoke_run_writes_a_readable_trace_and_a_summary(tmp_path, capsys):
    assert production_recordings.main(["--out", str(tmp_path), "--allow-cpu"]) == 0
    with gzip.open(tmp_path / "step-trace.json.gz", "rt") as f:
        trace = json.load(f)
    names = {e.name for e in read_chrome_trace(trace)}
    assert {"forward", "backward", "optimizer"} <= names
    summary = (tmp_path / "summary.txt").read_text()
    assert summary.startswith("CPU, torch") and "need a CUDA GPU" in summary
    assert not (tmp_path / "memory-snapshot.pickle").exists()


def test_without_a_gpu_it_refuses_unless_allowed(tmp_path, capsys):
    assert production_recordings.main(["--out", str(tmp_path)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
