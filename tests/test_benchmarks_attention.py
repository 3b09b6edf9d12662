"""benchmarks.attention still runs: its CPU smoke mode, and its refusal without a GPU."""

import json

import pytest

from benchmarks import attention
from utils import device


@pytest.mark.skipif(device.HAS_CUDA, reason="the refusal is for machines without a GPU")
def test_refuses_without_a_gpu(capsys):
    assert attention.main(["--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(device.HAS_CUDA, reason="the smoke mode is for machines without a GPU")
def test_cpu_smoke_run_checks_and_times_every_case(tmp_path, capsys):
    out = tmp_path / "results.json"
    assert attention.main(["--allow-cpu", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "say nothing about GPU speed" in printed
    saved = json.loads(out.read_text())
    kernels = [r["kernel"] for r in saved["results"]]
    assert kernels[0] == "flash_attention fwd" and "SDPA MATH" in kernels and "naive (S and P in HBM)" in kernels
    assert kernels[-5:] == ["rms_norm fwd", "rope", "swiglu gate", "exp2 (SFU)", "paged attention decode"]
    assert all(r["value"] > 0 and r["verdict"] == "n/a" for r in saved["results"])
