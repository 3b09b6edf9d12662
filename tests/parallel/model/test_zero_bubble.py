"""utils.parallel.model.zero_bubble: valid split-backward schedules whose bubble and memory are Table 2 of arXiv:2401.10241.

The paper's Table 2 (bubble of the largest stage, peak activation memory):
1F1B (p-1)(T_F+T_B+T_W), p M_B; ZB-H1 (p-1)(T_F+T_B-T_W), p M_B; ZB-H2 (p-1)(T_F+T_B-2T_W), (2p-1) M_B.
Its analysis takes a W no longer than an F or a B; the times below keep to that.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from utils.parallel.model import pipeline as pp
from utils.parallel.model import zero_bubble as zb

TIMES = [(1.0, 1.0, 1.0), (1.0, 1.2, 0.8), (1.0, 2.0, 1.0), (1.2, 1.0, 0.7), (1.0, 1.0, 0.5)]
SIZES = [(2, 3), (3, 5), (4, 8), (4, 12), (8, 16), (8, 24)]


@pytest.mark.parametrize("kind", zb.KINDS)
@pytest.mark.parametrize("p,m", SIZES + [(4, 2), (1, 3), (5, 5)])
def test_every_schedule_is_valid_and_complete(kind, p, m):
    ops = zb.schedule(kind, p, m)
    pp.check_valid(ops, p, m, kinds="FBW")
    assert len(ops) == 3 * p * m


@given(kind=st.sampled_from(zb.KINDS), p=st.integers(1, 6), m=st.integers(1, 14),
       tf=st.floats(0.1, 4.0), tb=st.floats(0.1, 4.0), tw=st.floats(0.1, 4.0))
@settings(max_examples=80, deadline=None)
def test_schedules_are_valid_for_any_times(kind, p, m, tf, tb, tw):
    pp.check_valid(zb.schedule(kind, p, m, tf, tb, tw), p, m, kinds="FBW")


@pytest.mark.parametrize("kind", zb.KINDS)
@pytest.mark.parametrize("p,m", SIZES)
@pytest.mark.parametrize("t", TIMES)
def test_stage_zero_bubble_is_the_papers_table_2(kind, p, m, t):
    if kind == "zb-h2" and m < 2 * p - 1:
        pytest.skip("ZB-H2 fills its warm-up with 2p - 1 forwards: it needs m >= 2p - 1")
    bubbles = zb.stage_bubble(zb.schedule(kind, p, m, *t))
    assert max(bubbles) == pytest.approx(bubbles[0], abs=1e-9)  # stage 0 idles most
    assert bubbles[0] == pytest.approx(zb.paper_bubble(kind, p, *t), abs=1e-9)


@pytest.mark.parametrize("p,m", SIZES)
def test_equal_times_h1_is_a_third_of_1f1b_and_h2_is_zero(p, m):
    one_f_one_b = zb.stage_bubble(zb.schedule("1f1b", p, m))[0]
    assert one_f_one_b == pytest.approx(3 * (p - 1))
    assert zb.stage_bubble(zb.schedule("zb-h1", p, m))[0] == pytest.approx(one_f_one_b / 3)
    if m >= 2 * p - 1:
        assert zb.stage_bubble(zb.schedule("zb-h2", p, m))[0] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("p,m", SIZES)
@pytest.mark.parametrize("t", TIMES)
def test_unsplit_1f1b_is_the_plain_simulator_with_a_longer_backward(p, m, t):
    tf, tb, tw = t
    split = zb.schedule("1f1b", p, m, tf, tb, tw)
    plain = pp.schedule("1f1b", p, m, t_forward=tf, t_backward=tb + tw)
    assert pp.makespan(split) == pytest.approx(pp.makespan(plain))
    # the per-stage measure of stage 0 is the global bubble of the 1F1B chapter: (p-1)(t_f + t_b)
    assert zb.stage_bubble(split)[0] == pytest.approx(pp.makespan(plain) - m * (tf + tb + tw))


@pytest.mark.parametrize("kind", zb.KINDS)
@pytest.mark.parametrize("p,m", [(4, 8), (4, 12), (8, 24), (3, 5)])
@pytest.mark.parametrize("share", [1.0, 0.9, 0.5])
def test_peak_memory_is_the_papers(kind, p, m, share):
    # Sections 2.1-2.2: ZB-H1 stays within 1F1B's p M_B (worker i holds (p-i+1) M_B + (i-1) M_W);
    # ZB-H2 needs (2p-1) M_B on stage 0.
    peaks = zb.peak_activations(zb.schedule(kind, p, m), share)
    assert peaks == pytest.approx([zb.paper_stage_memory(kind, p, r, share) for r in range(p)])
    assert max(peaks) == pytest.approx({"1f1b": p, "zb-h1": p, "zb-h2": 2 * p - 1}[kind])


def test_deepseek_zb1p_formula_is_qi_zb_h1_with_a_full_backward():
    # DeepSeek-V3 Table 2 (arXiv:2412.19437) writes ZB1P as (PP-1)(F + B - 2W) with B the full backward.
    for tf, tb, tw in TIMES:
        assert zb.paper_bubble("zb-h1", 8, tf, tb, tw) == pytest.approx(7 * (tf + (tb + tw) - 2 * tw))


def test_orders_follow_the_warm_up_and_lag_of_the_paper():
    h1 = zb.stage_orders("zb-h1", 4, 8)
    assert [k for k, _, _ in h1[0][:6]] == list("FFFFBW")  # stage 0: p - 1 warm-up forwards, W right behind B
    assert [k for k, _, _ in h1[3][:7]] == list("FBFBFBF")  # last stage: W trails B by p - 1 micro-batches
    assert h1[3][7] == ("B", 0, 3) and h1[3][8] == ("W", 0, 0)
    h2 = zb.stage_orders("zb-h2", 4, 8)
    assert [k for k, _, _ in h2[0][:8]] == list("FFFFFFFB")  # 2(p - 1) warm-up forwards, then F, B
    assert [k for k, _, _ in h2[3][-7:]] == list("WWWWWWW")  # the last stage ends with 2(p-1)+1 Ws


@pytest.mark.parametrize("call,match", [
    (lambda: zb.schedule("zb-h3", 4, 8), "'1f1b', 'zb-h1', 'zb-h2'"),
    (lambda: zb.schedule("zb-h1", 0, 8), "n_stages must be a positive int"),
    (lambda: zb.schedule("zb-h1", 4, 0), "n_microbatches must be a positive int"),
    (lambda: zb.schedule("zb-h1", 4, 8, t_weight_grad=0.0), "t_weight_grad"),
    (lambda: zb.paper_bubble("gpipe", 4), "must be one of"),
    (lambda: zb.stage_bubble([]), "empty"),
    (lambda: zb.peak_activations(zb.schedule("zb-h1", 2, 2), 1.5), "weight_grad_share must be in"),
    (lambda: zb.paper_stage_memory("zb-h1", 4, 4, 0.5), "stage must be below"),
])
def test_bad_input_raises_value_error_naming_what_is_allowed(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def _torch_zb1p_order(rank, world_size, m):
    import torch
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, ScheduleInterleavedZeroBubble

    stage = PipelineStage(nn.Linear(4, 4), rank, world_size, torch.device("cpu"))
    runner = ScheduleInterleavedZeroBubble([stage], n_microbatches=m, loss_fn=nn.functional.mse_loss)
    return [(str(a.computation_type.value), a.microbatch_index) for a in runner.pipeline_order[rank] if a is not None]


@pytest.mark.parametrize("world_size,m", [(3, 5)])
def test_torch_zb1p_with_one_stage_per_rank_is_this_zb_h1(world_size, m):
    # torch.distributed.pipelining's ScheduleInterleavedZeroBubble ("implementing the ZB1P schedule in the paper")
    # builds its per-rank order of F, I (input gradient: our B) and W without running; it must equal ours.
    from utils.dist import launch

    orders = launch(_torch_zb1p_order, world_size, m, timeout=120)
    for rank, order in enumerate(orders):
        assert order == [("I" if k == "B" else k, i) for k, _, i in zb.stage_orders("zb-h1", world_size, m)[rank]]
