"""benchmarks.decode_kernels: its CPU smoke mode, its refusal without a GPU, and its place in the harness."""

import json

import pytest

from benchmarks import __main__ as harness, decode_kernels
from utils import device


@pytest.mark.skipif(device.HAS_CUDA, reason="the refusal is for machines without a GPU")
def test_refuses_without_a_gpu(capsys):
    assert decode_kernels.main(["--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(device.HAS_CUDA, reason="the smoke mode is for machines without a GPU")
def test_cpu_smoke_run_checks_and_times_every_case(tmp_path, capsys):
    out = tmp_path / "results.json"
    assert decode_kernels.main(["--allow-cpu", "--quick", "--json", str(out)]) == 0
    assert "say nothing about GPU speed" in capsys.readouterr().out
    rows = json.loads(out.read_text())["results"]
    assert [r["kernel"] for r in rows] == ["split-KV paged decode", "int4 matmul (decode)", "int4 matmul (decode)",
                                           "int8 matmul (decode)"]
    assert [r["shape"].split(",")[0] for r in rows[1:]] == ["M=1", "M=16", "M=1"]
    assert all(r["value"] > 0 and r["baseline_value"] > 0 and r["verdict"] == "n/a" for r in rows)
    assert "3x the unsplit kernel" in rows[0]["target"] and "70% of peak HBM" in rows[1]["target"]


def test_the_decode_cases_are_listed_as_not_yet_recorded():
    assert {"split-KV paged decode", "int4 matmul (decode)", "int8 matmul (decode)"} <= set(harness.NOT_YET_RECORDED)
    assert all("not yet run" in why for why in harness.NOT_YET_RECORDED.values())
