import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from utils.rl import post_training_plots as plots  # noqa: E402


@pytest.mark.parametrize("call", [
    lambda: plots.plot_pipeline(),
    lambda: plots.plot_singular_values(rank=3, d=16),
    lambda: plots.plot_lora_memory(rank=16, targets=("q_proj", "k_proj", "v_proj", "o_proj"), model="Llama-3-8B",
                                   frozen_bytes=0.5),
    lambda: plots.plot_rlhf_memory(model="LLaMA-2-70B", n_gpus=64, stage=2),
    lambda: plots.plot_step_time(model="Llama-3-8B", group_size=4, response_len=128, tp=2, algorithm="ppo"),
    lambda: plots.plot_step_time(algorithm="ppo", epochs=4),
    lambda: plots.plot_step_timeline(model="LLaMA-2-70B", n_gpus=16, n_rollout_gpus=8, tp=4, epochs=2),
    lambda: plots.plot_placement_memory(model="LLaMA-2-7B", algorithm="grpo", n_gpus=8, tp=1, n_rollout_gpus=4),
])
def test_each_plot_returns_a_figure(call):
    fig = call()
    assert isinstance(fig, Figure) and fig.axes
    plt.close(fig)


def test_the_singular_value_plot_shows_rank_r():
    fig = plots.plot_singular_values(rank=5, d=20)
    low = fig.axes[0].lines[1].get_ydata()
    assert (low[:5] > 1e-3 * low[0]).all() and (low[5:] < 1e-10 * low[0]).all()
    plt.close(fig)


def test_the_timeline_has_one_panel_per_placement_and_one_row_per_lane():
    fig = plots.plot_step_timeline(n_gpus=8, n_rollout_gpus=4)
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == ["colocated", "disaggregated", "async"]
    assert [len(ax.get_yticks()) for ax in fig.axes] == [1, 2, 2]
    plt.close(fig)
