import pytest

from utils.memory import zero_model_state_bytes


@pytest.mark.parametrize("stage, published_gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_figure_1(stage, published_gb):
    # ZeRO (arXiv:1910.02054), Figure 1: Psi = 7.5B parameters, N_d = 64, K = 12.
    gb = zero_model_state_bytes(7.5e9, 64, stage) / 1e9
    assert round(gb, 1) == published_gb


@pytest.mark.parametrize("kwargs", [
    dict(n_params=1e9, n_gpus=8, stage=4),
    dict(n_params=1e9, n_gpus=8, stage=-1),
    dict(n_params=0, n_gpus=8, stage=1),
    dict(n_params=1e9, n_gpus=0, stage=1),
])
def test_bad_input_raises(kwargs):
    with pytest.raises(ValueError):
        zero_model_state_bytes(**kwargs)
