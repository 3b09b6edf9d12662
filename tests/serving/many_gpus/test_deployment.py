"""Tests of utils.serving.many_gpus.deployment: layouts by hand, the single-GPU limit, and the published rows."""

from __future__ import annotations

import pytest

from utils.attention.kv_cache import MODELS
from utils.gpu import hardware
from utils.parallel.comm.network import ring_allreduce_time
from utils.serving.many_gpus import deployment as d
from utils.serving.many_gpus import published_deployments as pd
from utils.serving.costs import step_time as st


def test_dense_shape_adds_up_to_the_parameters_a_step_reads():
    m = d.dense_shape("Llama-3-8B")
    assert m.attention_params + m.dense_params + m.lm_head_params == st.served_model("Llama-3-8B").n_params
    assert m.attention_params == 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024)


def test_one_gpu_dense_step_equals_step_time():
    # tp = 1, no experts: the deployment step is step_time's two rooflines (the LM head and FFN folded in one part)
    m, layout = d.dense_shape("Llama-3-8B"), d.Layout()
    for batch, ctx in ((1, 1024), (64, 2048), (512, 512)):
        ours = d.step(m, layout, batch, ctx).seconds
        theirs = st.decode_step_seconds(st.served_model("Llama-3-8B"), batch, ctx, st.Roof.of())
        assert ours == pytest.approx(theirs, rel=0.02)  # per-part maxima of three parts instead of one


def test_kv_heads_are_split_then_replicated_under_tp():
    m = d.dense_shape("Llama-3-70B")  # 8 KV heads
    per_head = 2 * 80 * 128 * 2
    assert d.kv_bytes_per_token_per_gpu(m, d.Layout(tp=4)) == 2 * per_head
    assert d.kv_bytes_per_token_per_gpu(m, d.Layout(tp=8)) == per_head
    assert d.kv_bytes_per_token_per_gpu(m, d.Layout(tp=16)) == per_head  # replicated: no further saving
    v3 = d.moe_shape()
    assert d.kv_bytes_per_token_per_gpu(v3, d.Layout(tp=8)) == MODELS["DeepSeek-V3"].cache_bytes()  # MLA: all of it


def test_tp_adds_two_ring_allreduces_per_layer():
    m, layout = d.dense_shape("Llama-3-70B"), d.Layout(tp=4, overlap=False)
    s = d.step(m, layout, 32, 1024)
    one = ring_allreduce_time(4, 32 * 8192 * 2, hardware.spec("H100-SXM").nvlink_bandwidth / 2, 0.0)
    assert s.comm == pytest.approx(2 * 80 * one)
    assert s.seconds == pytest.approx(s.compute + s.comm)
    assert d.step(m, d.Layout(tp=4), 32, 1024).seconds == pytest.approx(s.compute + s.comm)  # never hidden


def test_ep_bytes_per_token():
    v3 = d.moe_shape()
    per_copy = 7168 * (1 + 2)
    # low-latency (decode): each of the 8 expert copies, remote unless on the own node
    assert d.ep_bytes_per_token(v3, d.Layout(ep=72)) == pytest.approx(8 * per_copy * 64 / 72)
    assert d.ep_bytes_per_token(v3, d.Layout(ep=8)) == 0  # one node: NVLink only
    assert d.nvlink_bytes_per_token(v3, d.Layout(ep=8)) == pytest.approx(8 * per_copy * 7 / 8)
    assert d.nvlink_bytes_per_token(v3, d.Layout(ep=72)) == pytest.approx(8 * per_copy * 7 / 72)
    # node-limited (prefill): at most 4 of the 4 nodes, 3/4 of them remote
    assert d.ep_bytes_per_token(v3, d.Layout(ep=32, nodes_per_token=4)) == pytest.approx(4 * 0.75 * per_copy)


def test_ep_weights_per_gpu():
    v3, layout = d.moe_shape(), d.Layout(ep=144, redundant_experts=32, weight_bytes=1.0)
    common = v3.attention_params + v3.dense_params + v3.shared_expert_params + v3.lm_head_params
    assert d.weight_bytes_per_gpu(v3, layout) == pytest.approx(common + 2 * 58 * 3 * 7168 * 2048)  # 2 experts


def test_best_at_tpot_is_the_largest_batch_meeting_it():
    m, layout = d.dense_shape("Llama-3-70B"), d.Layout(tp=8)
    b, rate = d.best_at_tpot(m, layout, 2048, 0.03)
    assert d.tpot_seconds(m, layout, b, 2048) <= 0.03
    try:  # b + 1 either misses the target or does not fit
        assert d.tpot_seconds(m, layout, b + 1, 2048) > 0.03
    except ValueError:
        pass
    assert rate == pytest.approx(b / d.step(m, layout, b, 2048).seconds / 8)
    assert d.best_at_tpot(m, layout, 2048, 1e-6) == (0, 0.0)


def test_mtp_keeps_accepted_tokens_per_step():
    v3 = d.moe_shape()
    one = d.Layout(ep=144, weight_bytes=1.0)
    mtp = d.Layout(ep=144, weight_bytes=1.0, tokens_per_step=2, accepted_per_step=1.875)
    s = d.step(v3, mtp, 64, 4096).seconds
    assert d.tpot_seconds(v3, mtp, 64, 4096) == pytest.approx(s / 1.875)
    assert d.step(v3, mtp, 64, 4096).parts["attention (cache)"] >= d.step(v3, one, 64, 4096).parts["attention (cache)"]


def test_published_deployments_stay_below_their_roofline_bound():
    # A bound must hold: no published run may beat it, and the runs reach a third to two thirds of it.
    for c in pd.hold_against():
        assert 0.3 < c.achieved < 0.7, (c.row.name, c.bound_per_node, c.achieved)
    names = {c.row.name for c in pd.hold_against()}
    assert len(names) == len(pd.ROWS) >= 4


def test_day6_and_lmsys_figures_as_published():
    values = {r.name: r.tokens_per_s_per_node.value for r in pd.ROWS}
    assert values["DeepSeek production decode (EP144, MTP)"] == 14_800
    assert values["SGLang decode (EP72)"] == 22_282
    assert values["DeepSeek profile prefill (EP32)"] == 62_713


@pytest.mark.parametrize("bad", [
    lambda: d.Layout(tp=0),
    lambda: d.Layout(tp=2, ep=2),
    lambda: d.Layout(tokens_per_step=2, accepted_per_step=3),
    lambda: d.dense_shape("DeepSeek-V3"),
    lambda: d.moe_shape("Mixtral 8x7B"),
    lambda: d.step(d.dense_shape("Llama-3-8B"), d.Layout(), 10_000, 32_768),  # does not fit
    lambda: d.step(d.dense_shape("Llama-3-8B"), d.Layout(), 0, 10),
    lambda: d.best_at_tpot(d.dense_shape("Llama-3-8B"), d.Layout(), 10, 0.0),
])
def test_bad_input_raises_value_error(bad):
    with pytest.raises(ValueError):
        bad()


def test_network_bound_rows_are_the_link_over_the_bytes_per_token():
    comparisons = pd.hold_against()
    assert all(c.binds == "network" and c.compute_bound_per_node > c.bound_per_node for c in comparisons)
    assert pd.PRODUCTION_DECODE_BATCH == 88  # Little's law on Day 6: 14,800 tokens/s / 8 GPUs / 21 tokens/s
    production = pd.ROWS[0]
    at_128 = production._replace(batch_per_gpu=128)  # LMSYS's batch: a network-bound bound does not move
    assert pd.hold_against((at_128,))[0].bound_per_node == pytest.approx(comparisons[0].bound_per_node)
    # by hand: the link's bytes per second over the bytes a token sends to its experts, times the kept tokens
    model, layout = d.moe_shape("DeepSeek-V3"), production.layout
    per_token = model.moe_layers * d.ep_bytes_per_token(model, layout) / layout.network_bytes_per_s
    expected = pd.GPUS_PER_NODE * layout.accepted_per_step / layout.tokens_per_step / per_token
    assert comparisons[0].bound_per_node == pytest.approx(expected)
