import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Annotation  # noqa: E402

from utils.attention import PagedKVCache  # noqa: E402
from utils.attention.allocation import POLICIES, sample_requests, simulate  # noqa: E402
from utils.attention.serving_plots import plot_block_tables, plot_decode_roofline, plot_memory_shares  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_decode_roofline_draws_for_every_model_choice():
    for model in ("LLaMA-2-7B", "Llama-3-8B", "Mistral-7B"):
        assert isinstance(plot_decode_roofline(model, context=1024), Figure)


def test_block_tables_draw_one_arrow_per_table_entry_and_leave_out_freed_sequences():
    cache = PagedKVCache(8, 4, 1, 2)
    a = cache.add_sequence()
    cache.append(a, torch.zeros(6, 1, 2), torch.zeros(6, 1, 2))
    b = cache.fork(a)
    cache.append(b, torch.zeros(1, 1, 2), torch.zeros(1, 1, 2))
    fig = plot_block_tables(cache, {a: "A", b: "B"})
    assert len(fig.axes[0].texts) >= 2 and sum(isinstance(t, Annotation) for t in fig.axes[0].texts) == 4
    cache.free(a)
    fig = plot_block_tables(cache, {a: "A", b: "B"})
    assert sum(isinstance(t, Annotation) for t in fig.axes[0].texts) == 2


def test_memory_shares_stack_to_the_simulated_whole():
    requests = sample_requests(40, 100, 100, max_len=512, arrivals_per_step=4, seed=0)
    results = {p: simulate(requests, p, capacity_tokens=2048, max_len=512) for p in POLICIES}
    fig = plot_memory_shares(results)
    sim_bars = [r for r in fig.axes[0].patches if r.get_alpha() == 0.9]
    assert len(sim_bars) == 5 * len(POLICIES)  # four components and the free share per policy
