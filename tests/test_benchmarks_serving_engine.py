"""benchmarks.serving_engine: CPU smoke mode, refusal without a GPU, roofline bound, place in the harness."""

import json
import re

import pytest
import torch

from benchmarks import __main__ as harness, serving_engine
from utils import device
from utils.attention.llama import TinyLlama
from utils.serving.costs.step_time import Roof, step_cost, step_seconds

LOOP = "serving engine decode (per-request attention loop)"


@pytest.mark.skipif(device.HAS_CUDA, reason="the refusal is for machines without a GPU")
def test_refuses_without_a_gpu(capsys):
    assert serving_engine.main(["--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(device.HAS_CUDA, reason="the smoke mode is for machines without a GPU")
def test_cpu_smoke_run_times_decode_only_steps_of_both_paths(tmp_path, capsys):
    out = tmp_path / "results.json"
    assert serving_engine.main(["--allow-cpu", "--quick", "--json", str(out)]) == 0
    assert "say nothing about GPU speed" in capsys.readouterr().out
    rows = json.loads(out.read_text())["results"]
    assert [r["kernel"] for r in rows] == ["serving engine decode", LOOP]
    assert all(r["unit"] == "tokens/s" and r["value"] > 0 and r["baseline_value"] > 0 and r["verdict"] == "n/a"
               and r["peak_fraction"] is None and "batch 4" in r["shape"] for r in rows)
    assert "50% of the roofline bound" in rows[0]["target"] and rows[1]["target"] == "reported only"
    ops = [int(re.search(r"(\d+) ATen ops/step", r["shape"]).group(1)) for r in rows]
    assert 0 < ops[0] < ops[1]  # one attention call per layer dispatches less than one per request per layer
    assert float(re.search(r"rel\. err ([0-9.e+-]+)", rows[0]["shape"]).group(1)) < 1e-5


def test_the_bound_of_the_1b_model_at_batch_64():
    """TinyLlama-1.1B's shape: parameter count, and the H100 step bound derived by hand (both parts memory-bound)."""
    with torch.device("meta"):
        model = TinyLlama(serving_engine.TINYLLAMA_1B)
    served = serving_engine.served_model(model, "1.1B")
    assert sum(p.numel() for p in model.parameters()) == serving_engine.TINYLLAMA_1B_PARAMS
    assert serving_engine.TINYLLAMA_1B_PARAMS == pytest.approx(1.1e9, rel=0.005)  # the "1.1B" of its name
    n = serving_engine.TINYLLAMA_1B_PARAMS - 32000 * 2048                      # the input embedding is a lookup
    kv_per_token = 2 * 22 * 4 * 64 * 2                                          # K and V, layers, KV heads, d, fp16
    assert (served.n_params, served.weight_bytes, served.kv_bytes_per_token) == (n, 2 * n, kv_per_token)
    roof = Roof.of("H100-SXM", "fp16")
    seconds = step_seconds(step_cost(served, [560] * 64), roof)
    assert seconds == pytest.approx((2 * n + 64 * 560 * kv_per_token) / 3.35e12)
    assert 64 / seconds == pytest.approx(74_000, rel=0.02)  # the bound the target halves: ~74k tokens/s


def test_the_engine_cases_are_listed_as_not_yet_recorded():
    assert {"serving engine decode", LOOP} <= set(harness.NOT_YET_RECORDED)
