"""The GPU benchmark scripts still run: their CPU smoke mode, and their refusal without a GPU."""

import json

import pytest

from benchmarks import gpu_architecture
from utils import device


@pytest.mark.skipif(device.HAS_CUDA, reason="the refusal is for machines without a GPU")
def test_refuses_without_a_gpu(capsys):
    assert gpu_architecture.main(["--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(device.HAS_CUDA, reason="the smoke mode is for machines without a GPU")
def test_cpu_smoke_run_prints_every_case_and_writes_json(tmp_path, capsys):
    out = tmp_path / "results.json"
    assert gpu_architecture.main(["--allow-cpu", "--quick", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "say nothing about GPU speed" in printed
    saved = json.loads(out.read_text())
    kernels = [r["kernel"] for r in saved["results"]]
    assert kernels == ["HBM copy (torch copy_)"] + [f"strided copy, stride {s}" for s in gpu_architecture.STRIDES] + \
        ["vector add", *gpu_architecture.VECTOR_ADD_VARIANTS, "fused softmax", "fused softmax",
         "persistent softmax", "persistent softmax", "tiled matmul", "tiled matmul, autotuned"]
    assert all(r["value"] > 0 and r["verdict"] == "n/a" for r in saved["results"])
    assert saved["header"]["torch"] and saved["header"]["triton"]
