"""The ring all-reduce benchmark still runs (a smoke test on gloo; its timings are not checked)."""

from benchmarks import ring_all_reduce


def test_benchmark_runs_on_cpu_ranks(capfd):
    ring_all_reduce.main(["--cpu-ranks", "2", "--max-mib", "1", "--repeats", "1"])
    out = capfd.readouterr().out
    assert "2 ranks, backend gloo" in out
    assert out.count("Ki ") == 9  # 4 KiB .. 1 MiB
