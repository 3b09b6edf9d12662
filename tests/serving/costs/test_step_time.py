"""Tests of utils.serving.costs.step_time: hand-derived step costs, the two roofline forms, and published figures."""

from __future__ import annotations

import math

import pytest

from utils.attention import decode_cost
from utils.attention.kv_cache import MODELS
from utils.serving.costs import step_time as st


def tiny(attn_flops: float = 0.0, kv: float = 100.0) -> st.ServedModel:
    """N = 1000 params in 2000 bytes, a 100-byte cache per token: small enough to count by hand."""
    return st.ServedModel("tiny", 1000, 2000, 2500, kv, attn_flops, attn_flops)


def test_step_cost_counts_tokens_pairs_and_bytes_by_hand():
    # two decodes at contexts 10 and 20; one chunk of 4 new tokens after 6 cached
    cost = st.step_cost(tiny(attn_flops=3.0), decode_contexts=[10, 20], prefill_chunks=[(4, 6)])
    assert cost.tokens == 2 + 4
    assert cost.linear.flops == 2 * 1000 * 6 and cost.linear.nbytes == 2000  # weights read once
    pairs = 10 + 20 + (4 * 6 + 4 * 5 // 2)  # causal chunk: each new token sees the 6 cached and those before it
    assert cost.attention.flops == 3.0 * pairs
    assert cost.attention.nbytes == 100 * (10 + 20 + 6 + 4)


def test_step_seconds_is_the_sum_of_two_rooflines_and_overlap_is_never_slower():
    roof = st.Roof(peak_flops=1000.0, bandwidth=100.0)
    cost = st.step_cost(tiny(attn_flops=1.0), decode_contexts=[50] * 8)
    linear = max(2 * 1000 * 8 / 1000, 2000 / 100)  # 16 s of FLOPs, 20 s of bytes
    attention = max(8 * 50 / 1000, 8 * 50 * 100 / 100)
    assert st.step_seconds(cost, roof) == pytest.approx(linear + attention)
    both = max((16000 + 400) / 1000, (2000 + 40000) / 100)
    assert st.step_seconds(cost, roof, overlap=True) == pytest.approx(both)
    assert st.step_seconds(cost, roof, overlap=True) <= st.step_seconds(cost, roof)


def test_overlap_form_equals_part_3s_decode_cost():
    model, roof = st.served_model("Llama-3-8B"), st.Roof.of("H100-SXM", "fp16")
    for batch, context in ((1, 0), (32, 2048), (256, 512)):
        cost = st.step_cost(model, [context] * batch)  # context 0: no cache, as decode_cost leaves it out
        want = batch / decode_cost.decode_tokens_per_second(decode_cost.params_read_per_step("Llama-3-8B"),
                                                             MODELS["Llama-3-8B"], batch, context)
        assert st.step_seconds(cost, roof, overlap=True) == pytest.approx(want, rel=1e-12)


def test_attention_flops_per_pair_for_gqa_and_mla():
    llama = MODELS["Llama-3-8B"]
    assert st.attention_flops_per_pair(llama) == 4 * 32 * 32 * 128
    v3 = MODELS["DeepSeek-V3"]  # 61 layers, 128 heads, d_c 512, d_R 64, d_h 128
    assert st.attention_flops_per_pair(v3) == 2 * 61 * 128 * (2 * 512 + 64)
    assert st.attention_flops_per_pair(v3, absorbed=False) == 2 * 61 * 128 * (2 * 128 + 64)
    # absorbed MLA in bf16 sits near the H100's ridge (295); GQA-8 of Llama 3 at 4 FLOPs/byte
    mla = st.attention_flops_per_pair(v3) / v3.cache_bytes(bytes_per_elem=2)
    assert mla == pytest.approx(128 * (2 * 512 + 64) / 576) and 240 < mla < 245
    assert st.attention_flops_per_pair(llama) / llama.cache_bytes() == 4


@pytest.mark.parametrize("kind", ["MHA", "GQA"])
def test_reproduces_the_scaling_books_llama2_13b_tables(kind):
    s = st.SCALING_BOOK_SETUP
    model = st.ServedModel(f"LLaMA 2-13B ({kind})", s["n_params"], s["weight_bytes"], s["weight_bytes"],
                           s["kv_bytes_per_sequence"][kind] / s["context"],
                           4 * 40 * 40 * 128, 4 * 40 * 40 * 128)
    roof = st.Roof(s["chips"] * s["flops_per_chip"], s["chips"] * s["bandwidth_per_chip"])
    for batch, published in st.SCALING_BOOK_LLAMA2_13B[kind].items():
        ms = 1e3 * st.decode_step_seconds(model, batch, s["context"], roof)
        assert ms == pytest.approx(published.value, abs=0.011), (batch, ms)


def test_scaling_book_pop_quiz_30b_on_16_tpu_v5e():
    # Ch. 7 pop quiz: 30B int8 weights, 16 chips of 8.1e11 B/s and 1.97e14 FLOP/s, 8192 tokens of 100 kB:
    # "at least 2.5 ms" at batch 4, "roughly 21ms" at batch 256 (the MLP part compute-bound there).
    model = st.ServedModel("30B", 30e9, 30e9, 30e9, 100e3, 0.0, 0.0)
    roof = st.Roof(16 * 1.97e14, 16 * 8.1e11)
    assert 1e3 * st.decode_step_seconds(model, 4, 8192, roof) == pytest.approx(2.5, abs=0.1)
    assert 1e3 * st.decode_step_seconds(model, 256, 8192, roof) == pytest.approx(21, abs=0.5)


def test_prefill_is_compute_bound_and_its_time_is_two_n_p_over_peak():
    model, roof = st.served_model("LLaMA-2-7B"), st.Roof.of("H100-SXM", "bf16")
    p = 2048
    cost = st.step_cost(model, prefill_chunks=[(p, 0)])
    assert cost.linear.intensity > roof.ridge
    linear = 2 * model.n_params * p / roof.peak_flops
    attention = max(model.attn_flops_prefill * p * (p + 1) / 2 / roof.peak_flops,
                    model.kv_bytes_per_token * p / roof.bandwidth)
    assert st.prefill_seconds(model, p, roof) == pytest.approx(linear + attention)


def test_serve_batch_metrics_are_consistent():
    model, roof = st.served_model("Llama-3-8B"), st.Roof.of()
    g = st.serve_batch(model, roof, batch=16, prompt_len=512, output_len=129)
    assert g.e2e == pytest.approx(g.ttft + g.tpot * 128)
    assert g.tokens_per_s == pytest.approx(16 * 129 / g.e2e)
    # TPOT lies between the first and last decode step's time
    assert st.decode_step_seconds(model, 16, 513, roof) <= g.tpot <= st.decode_step_seconds(model, 16, 640, roof)
    one = st.serve_batch(model, roof, batch=1, prompt_len=512, output_len=1)
    assert one.tpot == 0 and one.e2e == one.ttft


def test_pareto_throughput_and_latency_both_grow_with_batch():
    model, roof = st.served_model("LLaMA-2-7B"), st.Roof.of()
    points = st.pareto(model, roof, 2048, [1, 2, 4, 8, 16, 32, 64])
    for (b0, t0, r0), (b1, t1, r1) in zip(points, points[1:]):
        assert t1 > t0 and r1 > r0
    # batch 1 is the weights streamed once: bandwidth / weight bytes steps per second (plus one cache)
    b, t, r = points[0]
    assert t == pytest.approx((model.weight_bytes + 2048 * model.kv_bytes_per_token) / roof.bandwidth)


def test_max_batch_at_tpot_is_the_largest_batch_meeting_the_target():
    model, roof = st.served_model("Llama-3-8B"), st.Roof.of()
    target = 0.02
    b = st.max_batch_at_tpot(model, roof, 1024, target)
    assert st.decode_step_seconds(model, b, 1024, roof) <= target < st.decode_step_seconds(model, b + 1, 1024, roof)
    hbm = 80e9
    capped = st.max_batch_at_tpot(model, roof, 1024, 1.0, hbm)
    assert capped == st.max_batch(model, 1024, hbm)
    assert st.max_batch_at_tpot(model, roof, 1024, 1e-6) == 0


def test_max_batch_matches_part_3():
    for name in ("LLaMA-2-7B", "Llama-3-8B"):
        model = st.served_model(name)
        assert st.max_batch(model, 2048, 80e9) == decode_cost.max_batch(decode_cost.param_count(name), MODELS[name],
                                                                        2048)


def test_littles_law():
    # 10,000 tokens/s at 50 ms per token: 500 sequences in flight; 2 requests/s of 30 s each: 60 requests
    assert st.littles_law(10_000, 0.05) == pytest.approx(500)
    assert st.littles_law(2, 30) == 60
    model, roof = st.served_model("Llama-3-8B"), st.Roof.of()
    b, t, r = st.pareto(model, roof, 1024, [48])[0]
    assert st.littles_law(r, t) == pytest.approx(b)  # decode: tokens/s x s/token = sequences in the batch


@pytest.mark.parametrize("bad", [
    lambda: st.step_cost(tiny()),
    lambda: st.step_cost(tiny(), [-1]),
    lambda: st.step_cost(tiny(), prefill_chunks=[(0, 3)]),
    lambda: st.step_cost(tiny(), prefill_chunks=[3]),
    lambda: st.served_model("GPT-5"),
    lambda: st.ServedModel("x", 0, 1, 1, 1, 0, 0),
    lambda: st.Roof.of("H100-SXM", "fp64"),
    lambda: st.max_batch(st.served_model("LLaMA-2-70B"), 1024, 80e9),
    lambda: st.max_batch_at_tpot(tiny(), st.Roof(1.0, 1.0), 10, 0),
    lambda: st.littles_law(-1, 1),
    lambda: st.serve_batch(tiny(), st.Roof(1.0, 1.0), 1, 10, 0),
])
def test_bad_input_raises_value_error(bad):
    with pytest.raises(ValueError):
        bad()


def test_colocated_request_rate_counts_the_prefill():
    # B = 362 at t = 20 ms, 256-token answers, 1024-token prompts prefilled in 15.8 ms (chapter 1's numbers)
    r = st.colocated_request_rate(362, 0.020, 0.0158, 256)
    assert r == pytest.approx(362 / (0.020 * 255 + 362 * 0.0158))
    assert r * 0.0158 < 1  # the prefill fits in the GPU's second, unlike B / W's 71 requests/s
    decode_only = 362 / (0.020 * 255)
    assert st.colocated_request_rate(362, 0.020, 0.0, 256) == pytest.approx(decode_only)  # no prefill: B / W
    # steady state by hand: r prefills and (1 - rP)/t steps of B tokens carry r (O - 1) decode tokens
    assert r * 255 == pytest.approx(362 * (1 - r * 0.0158) / 0.020)
    with pytest.raises(ValueError, match="prefill_seconds"):
        st.colocated_request_rate(8, 0.02, -1.0, 10)
    with pytest.raises(ValueError, match="batch"):
        st.colocated_request_rate(0, 0.02, 0.01, 10)
