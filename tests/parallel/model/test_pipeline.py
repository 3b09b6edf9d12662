"""utils.parallel.model.pipeline: the schedules are valid, their bubble is the papers' closed form, 1F1B bounds memory.

The executed pipeline (utils.parallel.model.pipeline_exec) is checked against one process in test_pipeline_exec.py.
"""

from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from utils.parallel.model import pipeline as pp

SIZES = [(2, 1), (2, 4), (3, 6), (4, 4), (4, 8), (4, 16), (8, 8), (8, 32)]
TIMES = [(1.0, 2.0), (1.0, 1.0), (1.0, 3.0), (0.7, 1.9)]


def _configs():
    for (p, m), kind in product(SIZES, pp.KINDS):
        if kind != "interleaved":
            yield kind, p, m, 1
        elif m % p == 0:
            yield from ((kind, p, m, v) for v in (2, 3, 4))


@pytest.mark.parametrize("kind,p,m,v", list(_configs()))
def test_every_schedule_is_valid(kind, p, m, v):
    ops = pp.schedule(kind, p, m, v)
    pp.check_valid(ops, p, m, v)
    assert len(ops) == 2 * p * m * v
    assert {(o.stage, o.chunk, o.microbatch, o.kind) for o in ops} == \
        {(s, c, i, k) for s in range(p) for c in range(v) for i in range(m) for k in "FB"}


@given(kind=st.sampled_from(pp.KINDS), p=st.integers(1, 6), groups=st.integers(1, 4), v=st.integers(1, 3),
       tf=st.floats(0.1, 5.0), tb=st.floats(0.1, 5.0))
@settings(max_examples=60, deadline=None)
def test_schedules_are_valid_for_any_times(kind, p, groups, v, tf, tb):
    v = v if kind == "interleaved" else 1
    m = groups * p
    pp.check_valid(pp.schedule(kind, p, m, v, tf, tb), p, m, v)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", SIZES)
@pytest.mark.parametrize("tf,tb", TIMES)
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(kind, p, m, tf, tb):
    # GPipe (arXiv:1811.06965): bubble O((p-1)/(m+p-1)); exactly that share with equal stages.
    ops = pp.schedule(kind, p, m, t_forward=tf, t_backward=tb)
    assert pp.bubble_fraction(ops) == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    assert pp.makespan(ops) == pytest.approx((m + p - 1) * (tf + tb))


@pytest.mark.parametrize("p,m", [(p, m) for p, m in SIZES if m % p == 0])
@pytest.mark.parametrize("v", [2, 3, 4])
@pytest.mark.parametrize("tf,tb", TIMES)
def test_interleaving_divides_the_bubble_time_by_v(p, m, v, tf, tb):
    # arXiv:2104.04473 section 2.2.2: bubble time / ideal time = (1/v) (p-1)/m.
    plain = pp.schedule("1f1b", p, m, t_forward=tf, t_backward=tb)
    ops = pp.schedule("interleaved", p, m, v, tf, tb)
    ideal = m * (tf + tb)
    assert (pp.makespan(ops) - ideal) / ideal == pytest.approx((p - 1) / (v * m), abs=1e-12)
    assert pp.bubble_fraction(ops) == pytest.approx(pp.ideal_bubble_fraction("interleaved", p, m, v), abs=1e-12)
    if p > 1:
        assert pp.bubble_fraction(ops) < pp.bubble_fraction(plain)


@pytest.mark.parametrize("p,m", SIZES)
def test_1f1b_holds_at_most_p_microbatches_gpipe_holds_m(p, m):
    gpipe = pp.peak_in_flight(pp.schedule("gpipe", p, m))
    one_f_one_b = pp.peak_in_flight(pp.schedule("1f1b", p, m))
    assert gpipe == [m] * p
    assert max(one_f_one_b) <= p
    assert one_f_one_b == [min(p - s, m) for s in range(p)]  # warm-up p - s - 1 forwards, then one more


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 16, 4), (8, 16, 2)])
def test_interleaved_first_stage_stores_more(p, m, v):
    # Megatron's warm-up on rank 0: (p-1)*2 + (v-1)*p forwards of chunks, then one more:
    # p*v + p - 1 chunks, i.e. p (1 + (p-1)/(p v)) micro-batches of a whole stage.
    peaks = pp.peak_in_flight(pp.schedule("interleaved", p, m, v))
    assert peaks[0] == p * v + p - 1
    assert peaks[0] / v == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_gpipe_order_and_1f1b_warmup():
    orders = pp.stage_orders("1f1b", 4, 8)
    assert orders[0][:4] == [("F", 0, 0), ("F", 0, 1), ("F", 0, 2), ("F", 0, 3)]
    assert orders[0][4] == ("B", 0, 0)
    assert orders[3][:3] == [("F", 0, 0), ("B", 0, 0), ("F", 0, 1)]
    assert [k for k, _, _ in pp.stage_orders("gpipe", 2, 3)[1]] == list("FFFBBB")


def test_check_valid_catches_broken_schedules():
    ops = pp.schedule("1f1b", 3, 3)
    with pytest.raises(ValueError, match="missing|expected"):
        pp.check_valid(ops[:-1], 3, 3)
    moved = [o._replace(start=o.start + 0.5, end=o.end + 0.5) if (o.stage, o.kind, o.microbatch) == (0, "F", 1)
             else o for o in ops]
    with pytest.raises(ValueError, match="at once"):
        pp.check_valid(moved, 3, 3)
    early = [o._replace(start=0.0, end=1.0) if (o.stage, o.kind, o.microbatch) == (1, "F", 0) else o for o in ops]
    with pytest.raises(ValueError, match="before"):
        pp.check_valid(early, 3, 3)


@pytest.mark.parametrize("call,match", [
    (lambda: pp.schedule("pipedream", 4, 8), "gpipe.*1f1b.*interleaved"),
    (lambda: pp.schedule("gpipe", 0, 8), "n_stages must be a positive int"),
    (lambda: pp.schedule("1f1b", 4, 0), "n_microbatches must be a positive int"),
    (lambda: pp.schedule("gpipe", 4, 8, n_chunks=2), "n_chunks must be 1"),
    (lambda: pp.schedule("interleaved", 4, 6, 2), "multiple of n_stages"),
    (lambda: pp.schedule("1f1b", 4, 8, t_backward=0.0), "t_backward"),
    (lambda: pp.ideal_bubble_fraction("zb", 4, 8), "must be one of"),
    (lambda: pp.bubble_fraction([]), "empty"),
])
def test_bad_input_raises_value_error_naming_what_is_allowed(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_check_valid_with_a_split_backward_needs_w_after_b():
    from utils.parallel.model import zero_bubble as zb

    ops = zb.schedule("zb-h1", 3, 4)
    pp.check_valid(ops, 3, 4, kinds="FBW")
    with pytest.raises(ValueError, match="expected|missing"):
        pp.check_valid(ops, 3, 4)  # the W ops are extra under kinds="FB"
    early_w = [o._replace(start=-1.0, end=-0.5) if (o.stage, o.kind, o.microbatch) == (2, "W", 0) else o for o in ops]
    with pytest.raises(ValueError, match="before"):
        pp.check_valid(early_w, 3, 4, kinds="FBW")


@pytest.mark.parametrize("p,m,v,n", [(4, 8, 2, 4), (4, 12, 2, 6), (4, 12, 2, 12), (4, 10, 2, 5), (4, 10, 4, 5),
                                     (8, 12, 2, 12), (2, 6, 3, 3)])
def test_group_size_keeps_the_bubble_and_costs_warm_up_memory(p, m, v, n):
    # Megatron-core's microbatch_group_size_per_vp_stage N: warm-up 2(p-s-1) + (v-1)N chunk forwards.
    ops = pp.schedule("interleaved", p, m, v, group_size=n)
    pp.check_valid(ops, p, m, v)
    assert pp.bubble_fraction(ops) == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)
    assert pp.peak_in_flight(ops)[0] == min(2 * (p - 1) + (v - 1) * n + 1, v * m)


def test_group_size_p_is_the_default_depth_first_order():
    assert pp.stage_orders("interleaved", 4, 8, 2, group_size=4) == pp.stage_orders("interleaved", 4, 8, 2)


@pytest.mark.parametrize("call,match", [
    (lambda: pp.schedule("interleaved", 4, 12, 2, group_size=3), r"group_size must lie in \[n_stages"),
    (lambda: pp.schedule("interleaved", 4, 12, 2, group_size=5), "divide"),
    (lambda: pp.schedule("1f1b", 4, 12, group_size=4), "group_size None"),
])
def test_bad_group_size_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()
