"""The inventory of stored tensors against Korthikanti et al. 2022 (arXiv:2205.05198), section 4 and Table 2."""

import pytest

from utils.parallel.model.activations import (
    bytes_by,
    first_stage_activation_bytes,
    interleave_factor,
    inventory_bytes,
    layer_inventory,
    plot_layer_breakdown,
    plot_stage_calculator,
)
from utils.parallel.memory import activation_bytes_per_layer

CASES = [(2048, 1, 12288, 96, 8), (4096, 2, 4096, 32, 4), (1024, 4, 2048, 16, 1), (64, 3, 48, 6, 2)]


@pytest.mark.parametrize("s, b, h, a, t", CASES)
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_inventory_sums_to_table_2(s, b, h, a, t, sp, recompute):
    items = layer_inventory(s, b, h, a, tp=t, sequence_parallel=sp, recompute=recompute)
    expected = activation_bytes_per_layer(s, b, h, a, tp=t, sequence_parallel=sp, recompute=recompute)
    assert inventory_bytes(items) == pytest.approx(expected)


def test_blocks_are_11_plus_5as_19_and_4_sbh():
    """Section 4.1: attention 11sbh + 5as^2b, MLP 19sbh, LayerNorms 4sbh."""
    s, b, h, a = 512, 2, 256, 8
    sbh = s * b * h
    blocks = bytes_by(layer_inventory(s, b, h, a), "block")
    assert blocks == {"layernorm": 4 * sbh, "attention": 11 * sbh + 5 * a * s * s * b, "mlp": 19 * sbh}


def test_replicated_part_is_the_10_of_table_2():
    s, b, h, a, t = 256, 1, 512, 8, 4
    kinds = bytes_by(layer_inventory(s, b, h, a, tp=t), "kind")
    sbh = s * b * h
    assert kinds == {"replicated": 10 * sbh, "sharded": 24 * sbh / t, "attention-core": 5 * a * s * s * b / t}


def test_masks_are_one_byte_and_everything_else_two():
    items = layer_inventory(128, 1, 64, 4)
    assert {x.name for x in items if x.element_bytes == 1} == {
        "softmax dropout mask", "attention dropout mask", "MLP dropout mask"}
    assert all(x.element_bytes == 2 for x in items if "mask" not in x.name)


def test_gpt3_layer_is_about_5_4_gib():
    """Section 4.1: 5as/h = 80 for GPT-3, so one layer stores sbh (34 + 80) bytes at b = 1."""
    nbytes = inventory_bytes(layer_inventory(2048, 1, 12288, 96))
    assert nbytes == 2048 * 12288 * 114


@pytest.mark.parametrize("kwargs, match", [
    (dict(tp=3), "multiple of tp"),
    (dict(tp=4, seq_len=130, sequence_parallel=True), "seq_len"),
    (dict(recompute="half"), "recompute"),
    (dict(hidden=66), "multiple of n_heads"),
    (dict(sequence_parallel="yes"), "sequence_parallel"),
])
def test_inventory_bad_input(kwargs, match):
    args = dict(seq_len=128, micro_batch=1, hidden=64, n_heads=4) | kwargs
    with pytest.raises(ValueError, match=match):
        layer_inventory(**args)


GPT3 = dict(seq_len=2048, hidden=12288, n_heads=96, n_layers=96, vocab=51200)


@pytest.mark.parametrize("pp", [1, 2, 8, 32])
def test_first_stage_holds_l_layers_whatever_p(pp):
    """Section 4.2.3: with 1F1B the first stage holds p micro-batches of L/p layers, L layers' worth (eq. 5)."""
    got = first_stage_activation_bytes(micro_batch=1, tp=8, pp=pp, sequence_parallel=True, **GPT3)
    per_layer = 2048 * 12288 / 8 * (34 + 80)
    assert got.layers == pytest.approx(96 * per_layer)


def test_extra_terms_follow_section_4_3():
    """sbhL/t (p/L + delta_{p=1} 4/L (1 + v/h)), written for sequence parallelism."""
    s, h, L, v, t = 2048, 6144, 48, 51200, 8
    kw = dict(seq_len=s, micro_batch=1, hidden=h, n_heads=64, n_layers=L, vocab=v, tp=t, sequence_parallel=True)
    one = first_stage_activation_bytes(pp=1, **kw)
    assert one.embedding_dropout + one.output_layer == pytest.approx(s * h * L / t * (1 / L + 4 / L * (1 + v / h)))
    four = first_stage_activation_bytes(pp=4, **kw)
    assert four.embedding_dropout + four.output_layer == pytest.approx(s * h * L / t * (4 / L))


def test_interleaving_multiplies_the_layers_by_the_paper_factor():
    assert interleave_factor(8, 1) == 1.0
    assert interleave_factor(8, 2) == pytest.approx(1 + 7 / 16)
    plain = first_stage_activation_bytes(micro_batch=1, tp=8, pp=8, sequence_parallel=True, **GPT3)
    inter = first_stage_activation_bytes(micro_batch=1, tp=8, pp=8, sequence_parallel=True, n_chunks=3, **GPT3)
    assert inter.layers / plain.layers == pytest.approx(1 + 7 / 24)


def test_gradient_accumulation_scales_with_the_micro_batch_not_the_global_batch():
    kw = dict(tp=8, pp=1, sequence_parallel=True, **GPT3)
    one = first_stage_activation_bytes(micro_batch=1, n_microbatches=1, **kw).total
    many = first_stage_activation_bytes(micro_batch=1, n_microbatches=64, **kw).total
    double = first_stage_activation_bytes(micro_batch=2, n_microbatches=1, **kw).total
    assert many == pytest.approx(one)
    assert double == pytest.approx(2 * one)
    few = first_stage_activation_bytes(micro_batch=1, n_microbatches=2, tp=8, pp=8, sequence_parallel=True, **GPT3)
    assert few.layers == pytest.approx(2 * 12 * activation_bytes_per_layer(2048, 1, 12288, 96, tp=8,
                                                                           sequence_parallel=True))


def test_selective_plus_sp_is_about_5x_below_tensor_parallel_alone():
    """Abstract: 'our method reduces activation memory by 5x' (GPT-3 175B, t = 8)."""
    kw = dict(micro_batch=1, tp=8, pp=8, **GPT3)
    base = first_stage_activation_bytes(**kw).layers
    ours = first_stage_activation_bytes(sequence_parallel=True, recompute="selective", **kw).layers
    assert base / ours == pytest.approx(23 / 4.25)


@pytest.mark.parametrize("kwargs, match", [(dict(n_layers=10, pp=4), "multiple of pp"), (dict(vocab=0), "vocab"),
                                           (dict(n_microbatches=0), "n_microbatches"), (dict(n_chunks=0), "n_chunks")])
def test_first_stage_bad_input(kwargs, match):
    args = dict(seq_len=128, micro_batch=1, hidden=64, n_heads=4, n_layers=8, vocab=100) | kwargs
    with pytest.raises(ValueError, match=match):
        first_stage_activation_bytes(**args)


def test_plot_functions_return_figures():
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    for fig in (plot_layer_breakdown(), plot_stage_calculator(), plot_stage_calculator(pp=1, recompute="none")):
        assert isinstance(fig, Figure)
        plt.close(fig)


def test_published_figures_follow_from_the_formulas():
    from utils.parallel.model.activations import PAPER_MODELS, PAPER_SEQ_LEN, PUBLISHED

    s = PAPER_SEQ_LEN
    gpt3, mtnlg = PAPER_MODELS["175B (GPT-3)"], PAPER_MODELS["530B (MT-NLG)"]
    assert 5 * gpt3["n_heads"] * s / gpt3["hidden"] == PUBLISHED["GPT-3 5as/h"].value
    for model, key in ((gpt3, "GPT-3"), (mtnlg, "MT-NLG")):
        kw = dict(seq_len=s, micro_batch=1, hidden=model["hidden"], n_heads=model["n_heads"])
        kept = activation_bytes_per_layer(recompute="selective", **kw) / activation_bytes_per_layer(**kw)
        assert round(1 - kept, 2) == PUBLISHED[f"selective saves, {key}"].value
        # the attention core's share of a layer's forward FLOPs, 4bs^2h / (24bsh^2 + 4bs^2h) = s / (6h + s)
        assert round(s / (6 * model["hidden"] + s), 3) == PUBLISHED[f"selective FLOPs overhead, {key}"].value
    # 12 L h^2 parameters per model, within 2% of the size in its name
    named = {"22B": 22, "175B (GPT-3)": 175, "530B (MT-NLG)": 530, "1T": 1000}
    for name, m in PAPER_MODELS.items():
        assert 12 * m["n_layers"] * m["hidden"] ** 2 / 1e9 == pytest.approx(named[name], rel=0.02)
