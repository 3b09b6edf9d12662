"""utils.parallel.data.fsdp_schedule: the FSDP step's timeline against hand formulas and its own invariants."""

import pytest

from utils.parallel.data.fsdp_schedule import peak_bytes_formula, simulate_fsdp_step

U, N = 1e6, 8  # parameters per unit, GPUs


def _held(step, kind):
    """Largest number of units holding ``kind`` at once."""
    return max(sum(1 for a in step.allocations if a.kind == kind and a.start <= t < a.end)
               for t in {a.start for a in step.allocations})


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("n_units", [3, 4, 12])
@pytest.mark.parametrize("act", [0.0, 0.5e6, 5e6])  # activations per unit below and above g U = 2e6
def test_peak_memory_equals_the_hand_formula(prefetch, n_units, act):
    step = simulate_fsdp_step(n_units, U, N, 1.0, 0.3, prefetch=prefetch, activation_bytes_per_unit=act)
    assert step.peak_bytes == pytest.approx(peak_bytes_formula(n_units, U, N, prefetch, act))


def test_page_formula_is_the_peak_without_activations_and_an_upper_bound_with_them():
    """The page's S + 2(2U) + 2(2U) + A: exact when A = 0, high by min(A_u, gU) otherwise."""
    s = 16 * 12 * U / N
    assert simulate_fsdp_step(12, U, N, 1.0, 0.3).peak_bytes == pytest.approx(s + 4 * U + 4 * U)
    act = 3e6
    peak = simulate_fsdp_step(12, U, N, 1.0, 0.3, activation_bytes_per_unit=act).peak_bytes
    assert peak == pytest.approx(s + 8 * U + 12 * act - min(act, 2 * U))


def test_prefetch_holds_two_gathered_units_and_two_units_of_gradients():
    with_prefetch = simulate_fsdp_step(6, U, N, 1.0, 0.3)
    without = simulate_fsdp_step(6, U, N, 1.0, 0.3, prefetch=False)
    assert _held(with_prefetch, "gathered parameters") == 2 and _held(with_prefetch, "unsharded gradients") == 2
    assert _held(without, "gathered parameters") == 1 and _held(without, "unsharded gradients") == 1


@pytest.mark.parametrize("t_ag, t_rs", [(0.3, 0.3), (0.5, 1.0), (0.0, 0.0)])
def test_compute_bound_prefetch_exposes_only_the_ends(t_ag, t_rs):
    n, t_f, t_b = 8, 1.0, 2.0
    step = simulate_fsdp_step(n, U, N, t_f, t_ag, t_b, t_rs)
    assert step.step_seconds == pytest.approx(n * (t_f + t_b) + 2 * t_ag + t_rs)
    assert step.exposed_comm_seconds() == pytest.approx(2 * t_ag + t_rs)


def test_without_prefetch_communication_is_fully_exposed():
    n, t_f, t_b, t_ag, t_rs = 8, 1.0, 2.0, 0.3, 0.4
    step = simulate_fsdp_step(n, U, N, t_f, t_ag, t_b, t_rs, prefetch=False)
    assert step.step_seconds == pytest.approx(n * (t_f + t_b + 2 * t_ag + t_rs))
    assert step.exposed_comm_seconds() == pytest.approx(n * (2 * t_ag + t_rs))


@pytest.mark.parametrize("t_f, t_ag, t_rs", [(1.0, 0.4, 0.4), (1.0, 1.5, 1.5), (1.0, 0.8, 2.0), (0.5, 3.0, 0.1)])
def test_prefetch_costs_max_of_compute_and_comm_per_unit(t_f, t_ag, t_rs):
    """For many units each one costs max(compute, comm) per pass, up to the ends of the passes."""
    t_b = 2 * t_f
    ends = t_f + t_b + 2 * t_ag + t_rs
    per_unit = max(t_f, t_ag) + max(t_b, t_ag + t_rs)
    for n in (50, 100):
        step = simulate_fsdp_step(n, U, N, t_f, t_ag, t_b, t_rs)
        assert n * per_unit <= step.step_seconds + 1e-9 <= n * per_unit + ends + 1e-9
        no = simulate_fsdp_step(n, U, N, t_f, t_ag, t_b, t_rs, prefetch=False).step_seconds
        assert no == pytest.approx(n * (t_f + t_b + 2 * t_ag + t_rs))


def test_streams_never_overlap_and_dependencies_hold():
    step = simulate_fsdp_step(5, U, N, 1.0, 0.7, 1.5, 0.9)
    for stream in ("compute", "comm"):
        ops = sorted((e for e in step.events if e.stream == stream), key=lambda e: e.start)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(ops, ops[1:]))
    for e in step.events:
        if e.stream == "compute":
            ag = [g for g in step.events if g.kind == "all-gather" and g.unit == e.unit and g.phase == e.phase]
            assert len(ag) == 1 and ag[0].end <= e.start
        if e.kind == "reduce-scatter":
            (b,) = [c for c in step.events if c.kind == "backward" and c.unit == e.unit]
            assert b.end <= e.start
    assert step.memory_at(step.step_seconds)["gathered parameters"] == 0  # everything freed at the end


@pytest.mark.parametrize("kwargs, match", [
    ({"n_units": 0}, "n_units"), ({"unit_params": -1}, "unit_params"), ({"n_gpus": 0}, "n_gpus"),
    ({"forward_seconds": 0}, "forward_seconds"), ({"all_gather_seconds": -1}, "all_gather_seconds"),
    ({"prefetch": "yes"}, "prefetch"), ({"grad_bytes": 0}, "grad_bytes"),
])
def test_bad_input_raises_value_error(kwargs, match):
    args = {"n_units": 4, "unit_params": U, "n_gpus": N, "forward_seconds": 1.0, "all_gather_seconds": 0.2} | kwargs
    with pytest.raises(ValueError, match=match):
        simulate_fsdp_step(**args)
    with pytest.raises(ValueError, match="n_units >= 3"):
        peak_bytes_formula(2, U, N)
