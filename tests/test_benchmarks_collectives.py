"""benchmarks.collectives: the harness's collectives, on two gloo processes (their CPU smoke mode)."""

import pytest

from benchmarks import collectives
from utils import device
from utils.gpu.hardware import spec
from utils.parallel.comm.bandwidth import bus_bandwidth_factor


@pytest.mark.skipif(device.HAS_CUDA, reason="the gloo smoke mode is for machines without a GPU")
def test_every_collective_is_timed_and_turned_into_bus_bandwidth(monkeypatch):
    seen = {}

    def fake_launch(fn, world, nbytes, repeats, backend, timeout):
        seen.update(world=world, backend=backend)
        return [{name: 0.5 for name in collectives.COLLECTIVES}] * world  # 0.5 s for every collective

    monkeypatch.setattr(collectives, "launch", fake_launch)
    rows = collectives.cases(on_gpu=False, quick=True, gpu=spec("H100-SXM"))
    assert seen == {"world": 2, "backend": "gloo"}
    nbytes = collectives.CPU_SMOKE_BYTES
    for row, name in zip(rows, collectives.COLLECTIVES):
        assert row.value == pytest.approx(nbytes / 0.5 * bus_bandwidth_factor(name, 2) / 1e9)
        assert row.baseline_value == pytest.approx(450.0)  # 900 GB/s NVLink, per direction
        assert row.peak_fraction == pytest.approx(row.value / 450.0)


@pytest.mark.skipif(device.HAS_CUDA, reason="the gloo smoke mode is for machines without a GPU")
def test_the_worker_runs_for_real_on_two_gloo_processes():
    rows = collectives.cases(on_gpu=False, quick=True, gpu=None)
    assert [r.kernel for r in rows] == ["all-reduce (gloo)", "all-gather (gloo)", "reduce-scatter (gloo)"]
    assert all(r.value > 0 and r.unit == "GB/s busbw" and r.peak_fraction is None for r in rows)
