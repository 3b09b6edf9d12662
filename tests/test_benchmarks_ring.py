"""The ring all-reduce benchmark still runs, through launch and under torchrun (smoke tests on gloo; timings are not checked)."""

from benchmarks import ring_all_reduce


def test_benchmark_runs_on_cpu_ranks(capfd):
    ring_all_reduce.main(["--cpu-ranks", "2", "--max-mib", "1", "--repeats", "1"])
    out = capfd.readouterr().out
    assert "2 ranks, backend gloo" in out
    assert out.count("Ki ") == 9  # 4 KiB .. 1 MiB


def test_the_same_worker_runs_under_torchrun():
    """torchrun (here on gloo, on a GPU machine with NCCL) drives the same worker through utils.dist.torchrun_main."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "benchmarks.ring_all_reduce", "--max-mib", "1", "--repeats", "1"],
        cwd=root, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 ranks, backend gloo" in done.stdout
