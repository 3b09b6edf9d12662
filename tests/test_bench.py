import time

import pytest

from utils import bench


def test_time_seconds_measures_the_call():
    seconds = bench.time_seconds(lambda: time.sleep(0.01), warmup=1, repeats=3)
    assert 0.009 < seconds < 0.2


def test_rates():
    assert bench.gb_per_s(3e9, 1.5) == pytest.approx(2.0)
    assert bench.tflop_per_s(bench.matmul_flops(1024, 1024, 1024), 1e-3) == pytest.approx(2.147483648)


@pytest.mark.parametrize("call", [
    lambda: bench.gb_per_s(1, 0),
    lambda: bench.tflop_per_s(-1, 1),
    lambda: bench.matmul_flops(0, 4, 4),
    lambda: bench.time_seconds(42),
    lambda: bench.time_seconds(lambda: None, repeats=0),
])
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()


def test_wall_clock_times_cpu_work_on_any_machine():
    """``wall_clock=True``: CUDA events would not see CPU work; the host clock does."""
    seconds = bench.time_seconds(lambda: time.sleep(0.02), warmup=0, repeats=3, wall_clock=True)
    assert 0.015 < seconds < 0.5


def test_gpu_without_triton_times_with_cuda_events(monkeypatch):
    """A CUDA machine without Triton (Windows) must not import triton.testing: it takes CUDA events."""
    calls = []
    monkeypatch.setattr(bench._device, "HAS_CUDA", True)
    monkeypatch.setattr(bench._device, "HAS_TRITON", False)
    monkeypatch.setattr(bench, "_cuda_event_seconds", lambda fn, warmup, repeats: calls.append((warmup, repeats)) or 1e-3)
    assert bench.time_seconds(lambda: None, warmup=2, repeats=5) == 1e-3
    assert calls == [(2, 5)]
