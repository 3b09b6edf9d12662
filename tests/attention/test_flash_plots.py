import math

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure

from utils.attention.flash_plots import (
    draw_online_softmax_step,
    draw_tiling_step,
    online_softmax_frames,
    plot_attention_roofline,
    plot_hbm_bytes,
)


def test_online_softmax_frames_show_the_worked_example_state():
    """x1 = [1, 2], x2 = [3, 4]: after block 2, m = 4, the old l = 1 + e^-1 is rescaled by e^(2-4)."""
    assert online_softmax_frames() == 4
    fig, ax = plt.subplots()
    draw_online_softmax_step(ax, 2)
    l_old = 1 + math.exp(-1)
    l_new = math.exp(-2) * l_old + math.exp(-1) + 1
    assert f"l = {math.exp(-2):.4f} x {l_old:.4f}" in ax.get_title() and f"= {l_new:.4f}" in ax.get_title()
    heights = [p.get_height() for p in ax.patches]
    assert heights == pytest.approx([math.exp(x - 4) for x in (1, 2, 3, 4)])
    ax.clear()
    draw_online_softmax_step(ax, 3)
    total = sum(math.exp(x) for x in (1, 2, 3, 4))
    assert [p.get_height() for p in ax.patches] == pytest.approx([math.exp(x) / total for x in (1, 2, 3, 4)])
    with pytest.raises(ValueError, match="step"):
        draw_online_softmax_step(ax, 4)
    plt.close(fig)


def test_tiling_visits_lower_triangle_when_causal():
    fig, ax = plt.subplots()
    draw_tiling_step(ax, 9, 4, 4, causal=True)  # 4 + 3 + 2 + 1 = 10 visits
    assert "step 10 of 10" in ax.get_title()
    with pytest.raises(ValueError, match="step"):
        draw_tiling_step(ax, 10, 4, 4, causal=True)
    draw_tiling_step(ax, 15, 4, 4)
    plt.close(fig)


def test_plots_return_figures_and_check_inputs():
    for fig in (plot_hbm_bytes(), plot_attention_roofline()):
        assert isinstance(fig, Figure)
        plt.close(fig)
    with pytest.raises(ValueError, match="max_log2_seq"):
        plot_hbm_bytes(max_log2_seq=30)
    with pytest.raises(ValueError, match="block_rows"):
        plot_hbm_bytes(block_rows=0)


def test_roofline_draws_the_three_models_and_the_measured_rates():
    fig = plot_attention_roofline(4096, 128, block_rows=64, measured={"a kernel": 416.0}, exp_per_s=4.1e12)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert any("re-read from HBM (B_r=64): 63 FLOP/B" in label for label in labels)  # ~ B_r in fp16
    assert any("hit L2 (K/V once): 2048 FLOP/B" in label for label in labels)  # N / 2
    assert any("measured: a kernel, 416" in label for label in labels)
    assert any("exponentials not overlapped" in label for label in labels)
    plt.close(fig)
