"""benchmarks.training_kernels: part 6's fused loss and fused AdamW rows, as a CPU smoke test."""

import benchmarks.__main__ as harness
from benchmarks import training_kernels


def test_the_cpu_smoke_run_checks_both_kernels_and_reports_them(capsys):
    assert training_kernels.main(["--allow-cpu"]) == 0
    out = capsys.readouterr().out
    assert "fused linear + cross-entropy" in out and "fused AdamW step" in out
    rows = training_kernels.cases(False, False, None)
    assert [r.kernel for r in rows] == ["fused linear + cross-entropy", "fused AdamW step"]
    assert rows[0].unit == "TFLOP/s" and rows[1].unit == "GB/s"
    assert "peak memory" in rows[0].target


def test_the_harness_runs_them_and_lists_them_as_not_yet_recorded():
    assert {"fused linear + cross-entropy", "fused AdamW step"} <= set(harness.NOT_YET_RECORDED)
    assert all("not yet run" in harness.NOT_YET_RECORDED[k] for k in ("fused linear + cross-entropy",
                                                                      "fused AdamW step"))


def test_without_a_gpu_it_refuses_unless_allowed(capsys):
    assert training_kernels.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
