"""The tensor-parallel benchmark still runs: through launch and under torchrun (smoke tests on gloo; timings not checked).

The benchmark itself asserts that the tensor-parallel stack equals the full one before it times anything."""

import subprocess
import sys
from pathlib import Path

from benchmarks import tensor_parallel


def test_quick_run_on_cpu_ranks_checks_and_counts(capfd):
    tensor_parallel.main(["--quick", "--world-size", "2"])
    out = capfd.readouterr().out
    assert "t = 2, 2 layers" in out and "say nothing about GPU speed" in out
    assert "all-reduces per step of a 2-layer stack: 4 (Megatron: 2 per layer)" in out
    assert "speed-up" in out


def test_the_same_worker_runs_under_torchrun():
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "benchmarks.tensor_parallel", "--quick"],
        cwd=root, capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "t = 2, 2 layers" in done.stdout and "all-reduces per step of a 2-layer stack: 4" in done.stdout
