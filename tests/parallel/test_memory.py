import pytest

from utils.parallel.memory import zero_model_state_bytes


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


# --- additions: breakdown, inverse, communication volume -------------------------------------------------

import math  # noqa: E402

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from utils.parallel.memory import (  # noqa: E402
    ZERO_PAPER_FIGURES,
    ZERO_PAPER_LARGEST_MODELS_64_GPUS,
    zero_communication_volume,
    zero_max_params,
    zero_model_state_breakdown,
)


@pytest.mark.parametrize("what, n_params, n_gpus, stage, published", ZERO_PAPER_FIGURES)
def test_every_published_figure_in_the_table(what, n_params, n_gpus, stage, published):
    gb = zero_model_state_bytes(n_params, n_gpus, stage) / 1e9
    assert round(gb, 1) == published.value, f"{what} ({published.source})"
    assert "arXiv:1910.02054" in published.source


def test_gpt2_needs_24_gb_of_model_states():
    # ZeRO, section 3.1: GPT-2 (1.5B parameters) needs 16 Psi = 24 GB for model states with mixed-precision
    # Adam, against 3 GB for its fp16 parameters alone.
    b = zero_model_state_breakdown(1.5e9, 1, 0)
    assert b.total == pytest.approx(24e9)
    assert b.params == pytest.approx(3e9)


def test_mixed_precision_adam_is_2_2_12():
    b = zero_model_state_breakdown(1e9, 1, 0)
    assert (b.params, b.grads, b.optimizer) == (2e9, 2e9, 12e9)


@given(st.floats(1, 1e13), st.integers(1, 4096), st.sampled_from([0, 1, 2, 3]), st.floats(0, 32))
def test_breakdown_sums_to_the_total_and_shrinks_with_each_stage(n_params, n_gpus, stage, k):
    b = zero_model_state_breakdown(n_params, n_gpus, stage, k)
    assert b.total == zero_model_state_bytes(n_params, n_gpus, stage, k)
    if stage > 0:
        assert b.total <= zero_model_state_bytes(n_params, n_gpus, stage - 1, k) * (1 + 1e-12)
    # stage 3 shards everything: exactly 1/N_d of the unsharded state.
    assert zero_model_state_bytes(n_params, n_gpus, 3, k) == pytest.approx(
        zero_model_state_bytes(n_params, 1, 0, k) / n_gpus)


def test_large_n_reductions_are_4x_and_8x():
    # ZeRO section 5.4: P_os and P_os+g reduce model-state memory "by up to 4x, 8x" (K = 12, N_d -> inf).
    base = zero_model_state_bytes(1e9, 1, 0)
    assert base / zero_model_state_bytes(1e9, 10**9, 1) == pytest.approx(4, rel=1e-6)
    assert base / zero_model_state_bytes(1e9, 10**9, 2) == pytest.approx(8, rel=1e-6)


@pytest.mark.parametrize("stage, published", ZERO_PAPER_LARGEST_MODELS_64_GPUS)
def test_largest_models_on_64_gpus_of_32_gb(stage, published):
    fits = zero_max_params(32e9, 64, stage)
    # The paper rounds down to a round size that fits: within 10 % below our exact bound.
    assert published.value <= fits * (1 + 1e-12) and fits < published.value * 1.1


@given(st.floats(1e6, 1e12), st.integers(1, 4096), st.sampled_from([0, 1, 2, 3]))
def test_max_params_inverts_the_memory_calculator(memory, n_gpus, stage):
    assert zero_model_state_bytes(zero_max_params(memory, n_gpus, stage), n_gpus, stage) == pytest.approx(memory)


@pytest.mark.parametrize("stage, factor", [(0, 2), (1, 2), (2, 2), (3, 3)])
def test_communication_volume_follows_section_7(stage, factor):
    assert zero_communication_volume(7.5e9, stage) == factor * 7.5e9


def test_stage_3_costs_one_and_a_half_times_data_parallelism():
    assert zero_communication_volume(1e9, 3) / zero_communication_volume(1e9, 0) == 1.5


@given(st.floats(1, 1e12), st.integers(1, 4096), st.sampled_from([0, 1, 2, 3]))
def test_exact_ring_volume_approaches_the_paper_figure(n_params, n_gpus, stage):
    exact = zero_communication_volume(n_params, stage, n_gpus)
    limit = zero_communication_volume(n_params, stage)
    assert exact == pytest.approx(limit * (n_gpus - 1) / n_gpus)
    assert exact < limit
    assert n_gpus > 1 or exact == 0


@pytest.mark.parametrize("call", [
    lambda: zero_model_state_breakdown(1e9, 8, 5),
    lambda: zero_model_state_breakdown(-1, 8, 1),
    lambda: zero_model_state_breakdown(1e9, 8, 1, optimizer_bytes_per_param=-1),
    lambda: zero_model_state_bytes(1e9, 8, True),
    lambda: zero_max_params(0, 8, 1),
    lambda: zero_max_params(32e9, 0, 1),
    lambda: zero_communication_volume(0, 1),
    lambda: zero_communication_volume(1e9, 4),
    lambda: zero_communication_volume(1e9, 1, n_gpus=0),
    lambda: zero_communication_volume(1e9, 1, n_gpus=2.5),
])
def test_new_functions_reject_bad_input(call):
    with pytest.raises(ValueError):
        call()


def test_volume_is_finite_for_huge_models():
    assert math.isfinite(zero_communication_volume(1e15, 3, 10**6))


# Activation memory: Korthikanti et al. 2022, arXiv:2205.05198, Table 2 and section 5.
from utils.parallel.memory import (  # noqa: E402
    activation_bytes_per_layer,
    tensor_parallel_allreduce_bytes_per_layer,
)

GPT3 = dict(seq_len=2048, hidden=12288, n_heads=96)  # the paper's Table 3 row for GPT-3 175B
MT_NLG = dict(seq_len=2048, hidden=20480, n_heads=128)  # the 530B row


@pytest.mark.parametrize("s, b, h, a, t", [(2048, 1, 12288, 96, 8), (4096, 2, 4096, 32, 4), (1024, 4, 2048, 16, 1)])
def test_activation_bytes_follow_table_2(s, b, h, a, t):
    sbh = s * b * h
    rows = {
        (1, False, "none"): sbh * (34 + 5 * a * s / h),
        (t, False, "none"): sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        (t, True, "none"): sbh * (34 / t + 5 * a * s / (h * t)),
        (t, False, "selective"): sbh * (10 + 24 / t),
        (t, True, "selective"): sbh * 34 / t,
        (t, False, "full"): 2 * sbh,
    }
    for (tp, sp, recompute), expected in rows.items():
        got = activation_bytes_per_layer(s, b, h, a, tp=tp, sequence_parallel=sp, recompute=recompute)
        assert got == pytest.approx(expected), (tp, sp, recompute)


def test_attention_term_of_gpt3_is_80():
    """Section 4.1: "for GPT-3, a = 96, s = 2048 and h = 12288, hence 5as/h = 80"."""
    whole = activation_bytes_per_layer(micro_batch=1, **GPT3)
    sbh = 2048 * 12288
    assert whole / sbh - 34 == pytest.approx(80)


@pytest.mark.parametrize("model, saving", [(GPT3, 0.70), (MT_NLG, 0.65)])
def test_selective_recompute_saves_70_and_65_percent(model, saving):
    """Section 5: selective recomputation cuts activation memory by 70% for GPT-3 and 65% for MT-NLG.

    The ratio 5as/h / (34 + 5as/h) is the same with or without t-way tensor + sequence parallelism
    (80/114 and 64/98); with tensor parallelism alone it would be smaller (the 10 is not divided by t).
    """
    kw = dict(micro_batch=1, tp=8, sequence_parallel=True, **model)
    kept = activation_bytes_per_layer(recompute="selective", **kw) / activation_bytes_per_layer(**kw)
    assert 1 - kept == pytest.approx(saving, abs=0.005)


def test_sequence_parallel_shards_everything_but_full_recompute_input_by_t():
    kw = dict(seq_len=2048, micro_batch=1, hidden=4096, n_heads=32)
    assert activation_bytes_per_layer(tp=4, sequence_parallel=True, **kw) == pytest.approx(
        activation_bytes_per_layer(**kw) / 4)
    assert activation_bytes_per_layer(tp=4, sequence_parallel=True, recompute="full", **kw) == pytest.approx(
        activation_bytes_per_layer(tp=1, recompute="full", **kw) / 4)


@pytest.mark.parametrize("kwargs, match", [
    (dict(recompute="some"), "recompute must be one of"),
    (dict(tp=0), "tp"),
    (dict(n_heads=7), "multiple of n_heads"),
    (dict(sequence_parallel=1), "sequence_parallel"),
    (dict(seq_len=1.5), "seq_len"),
])
def test_activation_bytes_bad_input(kwargs, match):
    args = dict(seq_len=128, micro_batch=1, hidden=64, n_heads=4) | kwargs
    with pytest.raises(ValueError, match=match):
        activation_bytes_per_layer(**args)


def test_tensor_parallel_allreduce_is_s_b_h_elements():
    assert tensor_parallel_allreduce_bytes_per_layer(2048, 1, 12288) == 2048 * 12288 * 2
    assert tensor_parallel_allreduce_bytes_per_layer(8, 2, 4, element_size=4) == 8 * 2 * 4 * 4
    with pytest.raises(ValueError, match="element_size"):
        tensor_parallel_allreduce_bytes_per_layer(8, 2, 4, element_size=3)
