import re

import matplotlib
import torch

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from utils.attention.llama import LlamaConfig, TinyLlama  # noqa: E402
from utils.serving.speculation.speculative import speculative_generate  # noqa: E402
from utils.serving.speculation.speculative_plots import animate_steps, plot_speedup, plot_speedup_against_batch  # noqa: E402


def test_plots_return_figures():
    assert isinstance(plot_speedup(0.7, 3, 0.1), Figure)
    assert isinstance(plot_speedup_against_batch("Llama-3-8B", 0.8, 4, 0.05, 2048), Figure)
    assert isinstance(plot_speedup_against_batch("LLaMA-2-7B", 0.6, 2, 0.0, 0), Figure)
    # a model whose weights alone exceed the GPU (the live widget offers it): said on the figure, no error
    texts = [t.get_text() for t in plot_speedup_against_batch("LLaMA-2-70B").axes[0].texts]
    assert any("exceed one H100-SXM's 80 GB" in t for t in texts), texts


def test_animation_has_alt_text_and_one_frame_per_step():
    torch.manual_seed(0)
    config = LlamaConfig(vocab=16, dim=16, n_layers=1, n_heads=2, n_kv_heads=2)
    target, draft = TinyLlama(config).eval(), TinyLlama(config).eval()
    result = speculative_generate(target, draft, torch.tensor([[1, 2, 3]]), 6, 2)
    html = animate_steps(result, prompt_len=3).data
    first = f"step 1 of {len(result.accepted)}: the draft proposes {len(result.proposals[0])} tokens"
    assert re.search(r'<img id="_anim_img\w+" alt="Speculative decoding, ' + first, html)
    assert f"the target keeps {result.accepted[-1]} (green)" in html  # the last frame's text, for the player
    assert html.count("data:image/png;base64") == len(result.accepted)
