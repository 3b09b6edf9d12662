import pytest

from utils.parallel.model.activations import PAPER_MODELS, PAPER_SEQ_LEN, PAPER_VOCAB, PUBLISHED
from utils.parallel.model.recompute_flops import (hardware_flops_per_iteration, model_flops_per_iteration,
                                            recompute_overhead)


def _layer_forward(B, s, h):
    # the matrix products of one layer, counted one by one: Q, K, V; QK^T; scores x V; output projection; MLP
    return 2 * B * s * h * 3 * h + 2 * B * s * s * h + 2 * B * s * s * h + 2 * B * s * h * h + 2 * 2 * B * s * h * 4 * h


def test_eq7_and_eq9_equal_a_product_by_product_count():
    B, s, h, L, V = 2, 256, 512, 6, 1000
    forward = L * _layer_forward(B, s, h) + 2 * B * s * h * V
    assert model_flops_per_iteration(B, s, h, L, V) == pytest.approx(3 * forward, rel=1e-12)
    full = 3 * forward + L * _layer_forward(B, s, h)  # one more forward of every layer, not of the logits
    assert hardware_flops_per_iteration(B, s, h, L, V, "full") == pytest.approx(full, rel=1e-12)


def test_selective_adds_4bs2h_per_layer_and_eq8_adds_three_times_that():
    B, s, h, L, V = 2, 256, 512, 6, 1000
    model = model_flops_per_iteration(B, s, h, L, V)
    corrected = hardware_flops_per_iteration(B, s, h, L, V, "selective") - model
    printed = hardware_flops_per_iteration(B, s, h, L, V, "selective", as_printed=True) - model
    assert corrected == pytest.approx(L * 4 * B * s * s * h, rel=1e-12)
    assert printed == pytest.approx(3 * corrected, rel=1e-12)


def test_eq8_reproduces_the_published_overheads_and_the_correct_count_is_a_third():
    for name, key in (("175B (GPT-3)", "GPT-3"), ("530B (MT-NLG)", "MT-NLG")):
        m = PAPER_MODELS[name]
        kw = dict(seq_len=PAPER_SEQ_LEN, hidden=m["hidden"], n_layers=m["n_layers"], vocab=PAPER_VOCAB)
        printed = recompute_overhead(as_printed=True, **kw)
        assert round(printed, 3) == PUBLISHED[f"selective FLOPs overhead, {key}"].value
        assert recompute_overhead(**kw) == pytest.approx(printed / 3, rel=1e-12)
    gpt3 = PAPER_MODELS["175B (GPT-3)"]
    assert recompute_overhead(PAPER_SEQ_LEN, gpt3["hidden"], gpt3["n_layers"], PAPER_VOCAB) == pytest.approx(
        0.009, abs=5e-4)
    assert recompute_overhead(PAPER_SEQ_LEN, gpt3["hidden"], gpt3["n_layers"], PAPER_VOCAB, "full") == pytest.approx(
        1 / 3, abs=0.01)
    assert recompute_overhead(PAPER_SEQ_LEN, gpt3["hidden"], gpt3["n_layers"], PAPER_VOCAB, "none") == 0


@pytest.mark.parametrize("kwargs", [dict(batch=0), dict(recompute="partial"), dict(as_printed=1), dict(vocab=1.5)])
def test_bad_input_raises(kwargs):
    args = dict(batch=1, seq_len=8, hidden=16, n_layers=2, vocab=32) | kwargs
    with pytest.raises(ValueError):
        hardware_flops_per_iteration(**args)
