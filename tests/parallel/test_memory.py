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
