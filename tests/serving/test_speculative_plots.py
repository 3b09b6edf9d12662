import matplotlib
import torch

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from utils.attention.llama import LlamaConfig, TinyLlama  # noqa: E402
from utils.serving.speculative import speculative_generate  # noqa: E402
from utils.serving.speculative_plots import animate_steps, plot_speedup, plot_speedup_against_batch  # noqa: E402


def test_plots_return_figures():
    assert isinstance(plot_speedup(0.7, 3, 0.1), Figure)
    assert isinstance(plot_speedup_against_batch("Llama-3-8B", 0.8, 4, 0.05, 2048), Figure)
    assert isinstance(plot_speedup_against_batch("LLaMA-2-7B", 0.6, 2, 0.0, 0), Figure)


def test_animation_has_alt_text_and_one_frame_per_step():
    torch.manual_seed(0)
    config = LlamaConfig(vocab=16, dim=16, n_layers=1, n_heads=2, n_kv_heads=2)
    target, draft = TinyLlama(config).eval(), TinyLlama(config).eval()
    result = speculative_generate(target, draft, torch.tensor([[1, 2, 3]]), 6, 2)
    html = animate_steps(result, prompt_len=3).data
    assert '<img alt="Speculative decoding' in html
    assert html.count("data:image/png;base64") == len(result.accepted)
