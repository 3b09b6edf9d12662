import numpy as np
import pytest

from utils.gpu import hardware
from utils.gpu import overhead as oh


def test_fit_line_recovers_a_known_line_and_matches_an_independent_solution():
    k = np.array([8, 16, 32, 64])
    line = oh.fit_line(k, 2e-5 + 6e-6 * k)
    assert line.slope == pytest.approx(6e-6) and line.intercept == pytest.approx(2e-5)
    # Noisy data: the slope must equal the closed form cov(k, t) / var(k).
    t = 1e-6 * np.array([50.0, 101.0, 190.0, 400.0])
    expected = np.sum((k - k.mean()) * (t - t.mean())) / np.sum((k - k.mean()) ** 2)
    assert oh.fit_line(k, t).slope == pytest.approx(expected)
    assert oh.fit_line(k, t)(10) == pytest.approx(oh.fit_line(k, t).intercept + 10 * expected)


def test_fit_overhead_bandwidth_recovers_its_parameters():
    n = 2.0 ** np.arange(0, 24, 2)
    t = 6e-6 + n * 8 / 20e9
    model = oh.fit_overhead_bandwidth(n, t, bytes_per_element=8)
    assert model.overhead_seconds == pytest.approx(6e-6)
    assert model.bandwidth_bytes_per_s == pytest.approx(20e9)
    assert model.crossover_elements == pytest.approx(6e-6 * 20e9 / 8)  # 15,000 elements
    assert model.seconds(model.crossover_elements) == pytest.approx(2 * 6e-6)


def test_crossover_on_an_h100():
    # A 5 us launch against the datasheet's 3.35 TB/s, fp32 x + 1 (read 4 bytes, write 4): 2.09 million elements.
    h100 = hardware.spec("H100-SXM")
    assert oh.crossover_elements(5e-6, h100.hbm_bandwidth, 8) == pytest.approx(2.09375e6)


def test_breakdown_names_each_regime():
    h100 = hardware.spec("H100-SXM")
    peak, bw = h100.flops("fp16"), h100.hbm_bandwidth
    # A 4096^3 fp16 matmul at 660 TFLOP/s: compute-bound, 2/3 of the roof.
    flops = 2 * 4096**3
    mm = oh.breakdown(flops / 660e12, flops, 3 * 4096**2 * 2, peak, bw)
    assert mm.regime == "compute" and mm.achieved_fraction == pytest.approx(660 / 989.4)
    # A vector add of 2^28 fp32 at 3,000 GB/s: memory-bound.
    nbytes = 3 * 2**28 * 4
    add = oh.breakdown(nbytes / 3000e9, 2**28, nbytes, peak, bw)
    assert add.regime == "memory" and add.overhead_seconds == pytest.approx(nbytes / 3000e9 - nbytes / bw)
    # The same add on 1,024 elements taking 5 us: almost all overhead.
    tiny = oh.breakdown(5e-6, 1024, 3 * 1024 * 4, peak, bw)
    assert tiny.regime == "overhead" and tiny.overhead_seconds / tiny.seconds > 0.99


def test_breakdown_refuses_a_time_faster_than_the_roof():
    with pytest.raises(ValueError, match="shorter than the roofline"):
        oh.breakdown(1e-9, 0, 1e9, 1e15, 1e12)


def test_launch_bound_step():
    # 2,000 kernels of 5 us launch each and 1 ms of GPU work: a 10 ms step, the GPU busy 10% of it.
    assert oh.launch_bound_step_seconds(2000, 5e-6, 1e-3) == pytest.approx(10e-3)
    assert oh.launch_bound_step_seconds(100, 5e-6, 1e-3) == pytest.approx(1e-3)


def test_cuda_graphs_blog_figures_are_consistent():
    blog = oh.CUDA_GRAPHS_BLOG
    kernel = blog["kernel_seconds"].value
    assert kernel < blog["graph_seconds"].value < blog["sync_every_step_seconds"].value \
        < blog["sync_every_kernel_seconds"].value
    assert all("Getting Started with CUDA Graphs" in p.source for p in blog.values())


@pytest.mark.parametrize("call", [
    lambda: oh.fit_line([1, 1, 1], [1, 2, 3]),
    lambda: oh.fit_line([1, 2], [1, 2, 3]),
    lambda: oh.fit_line([1, 2], [1, float("nan")]),
    lambda: oh.fit_overhead_bandwidth([1, 2, 3], [1, 2, 3], 0),
    lambda: oh.fit_overhead_bandwidth([1, 2, 3], [1, 0, 3], 8),
    lambda: oh.fit_overhead_bandwidth([1, 10, 100], [3e-6, 2e-6, 1e-6], 8),  # falling times: no bandwidth
    lambda: oh.crossover_elements(0, 1e12, 8),
    lambda: oh.launch_bound_step_seconds(0, 5e-6, 1e-3),
    lambda: oh.breakdown(0, 1, 1, 1, 1),
])
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_plot_per_op_time_draws():
    import matplotlib

    matplotlib.use("Agg")
    n = 2.0 ** np.arange(0, 22, 2)
    model = oh.OverheadModel(6e-6, 20e9, 8)
    fig = oh.plot_per_op_time(n, model.seconds(n), model)
    assert len(fig.axes) == 1
