"""The pipeline-schedules benchmark still runs on gloo (a smoke test: gradients are checked, timings are not)."""

from benchmarks import pipeline_schedules


def test_quick_run_checks_gradients_and_reports_both_schedules(capfd):
    medians = pipeline_schedules.main(["--world-size", "2", "--quick"])
    out = capfd.readouterr().out
    assert "2 stages" in out
    for kind in ("gpipe", "1f1b"):
        assert f"{kind:>6}: same gradients as one process" in out
        assert 0.0 <= medians[kind] < 1.0
    assert "(p-1)/(m+p-1) = 20.0%" in out  # p = 2, m = 4
