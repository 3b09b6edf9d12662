"""The calibrated serving model: the bound at fractions of 1, hand-worked values, the KV cap, the fit."""

from __future__ import annotations

import math

import pytest

from utils.gpu import hardware
from utils.serving.costs import calibrated as cal
from utils.serving.costs import step_time as st

H100 = hardware.spec("H100-SXM")
FP8_70B = st.served_model("Llama-3-70B", weight_bytes_per_param=1, kv_bytes_per_elem=1)
ROOF_2 = st.Roof.of("H100-SXM", "fp8", n_chips=2)
HBM_2 = 2 * H100.hbm_bytes


def test_at_the_roof_the_static_batch_is_serve_batch():
    model = st.served_model("Llama-3-8B")
    roof = st.Roof.of("A100-SXM4-80GB", "bf16")
    for batch in (1, 8, 9, 64):
        assert cal.static_batch(model, roof, batch, 512, 33, cal.ROOF) == st.serve_batch(model, roof, batch, 512, 33)


def test_a_concurrency_one_request_by_hand():
    """Llama 3 70B in FP8 on two H100s, 5000 tokens in, 500 out, alone: each decode step reads the weights and a
    5,250-token cache (both memory-bound at one token), over the latency fraction; one 5000-token prefill
    (8192 // 5000 = 1 prompt per step) over the prefill fraction, spread over the 499 gaps."""
    a = cal.Achieved(prefill=0.5, decode=0.8, latency_decode=0.25)
    w = 2 * H100.hbm_bandwidth
    step = (FP8_70B.weight_bytes + FP8_70B.kv_bytes_per_token * 5250) / w / 0.25
    prefill = st.prefill_seconds(FP8_70B, 5000, ROOF_2) / 0.5
    point = cal.continuous(FP8_70B, ROOF_2, HBM_2, 5000, 500, concurrency=1, achieved=a)
    assert point.batch == 1
    assert point.step_seconds == pytest.approx(step, rel=1e-12)
    assert point.ttft == pytest.approx(prefill, rel=1e-12)
    assert point.itl == pytest.approx(step + prefill / 499, rel=1e-12)
    assert point.tokens_per_s == pytest.approx(500 / (499 * step + prefill), rel=1e-12)


def test_short_prompts_share_a_prefill_step():
    """128-token prompts: 64 share an 8,192-token step, so each pays 1/64 of it: its own 2 N 128 FLOPs at the peak
    (plus its attention), not the weight read (10.4 ms on two H100s) a prompt alone would pay."""
    per_request = cal.prefill_share_seconds(FP8_70B, 128, ROOF_2, cal.ROOF)
    assert per_request == pytest.approx(st.prefill_seconds(FP8_70B, 128, ROOF_2, batch=64) / 64, rel=1e-12)
    assert per_request == pytest.approx(2 * FP8_70B.n_params * 128 / ROOF_2.peak_flops, rel=0.01)
    assert per_request < 0.45 * st.prefill_seconds(FP8_70B, 128, ROOF_2)


def test_the_batch_is_capped_by_the_kv_memory():
    """0.9 of the 160 GB the weights leave, in 5,500-token FP8 caches of 160 KiB per token (80 layers, 8 KV heads,
    128 dims, K and V): the plateau NIM shows from concurrency 100 on."""
    limit = cal.kv_batch_limit(FP8_70B, HBM_2, 5500)
    assert FP8_70B.kv_bytes_per_token == 80 * 8 * 128 * 2
    assert limit == int(0.9 * (HBM_2 - FP8_70B.resident_bytes) // (FP8_70B.kv_bytes_per_token * 5500))
    assert 80 < limit < 100
    saturated = cal.continuous(FP8_70B, ROOF_2, HBM_2, 5000, 500, concurrency=250)
    assert saturated == cal.continuous(FP8_70B, ROOF_2, HBM_2, 5000, 500)
    assert saturated.batch == limit
    small = st.served_model("Llama-3-8B", weight_bytes_per_param=1, kv_bytes_per_elem=1)
    assert cal.continuous(small, ROOF_2, HBM_2, 128, 128).batch == 2048  # the engine's largest batch


def test_the_decode_fraction_changes_at_the_latency_batch():
    a = cal.Achieved(0.5, 0.8, 0.3)
    assert cal.decode_fraction(cal.LATENCY_BATCH, a) == 0.3
    assert cal.decode_fraction(cal.LATENCY_BATCH + 1, a) == 0.8


def test_the_calibration_is_slower_than_the_bound():
    bound = cal.continuous(FP8_70B, ROOF_2, HBM_2, 1000, 1000, achieved=cal.ROOF)
    expected = cal.continuous(FP8_70B, ROOF_2, HBM_2, 1000, 1000)
    assert expected.batch == bound.batch
    assert expected.tokens_per_s < bound.tokens_per_s and expected.itl > bound.itl


def test_the_fit_recovers_known_fractions():
    """Published values made from known fractions (one row per phase mix) are fitted back to within the grid."""
    truth = cal.Achieved(prefill=0.45, decode=0.7, latency_decode=0.35)
    model = st.served_model("Llama-3-8B", weight_bytes_per_param=1, kv_bytes_per_elem=1)
    roof = st.Roof.of("H100-SXM", "fp8")
    hbm = H100.hbm_bytes
    cases = [(2048, 128, None), (128, 2048, None), (1000, 1000, None), (5000, 500, 1), (5000, 500, 4)]

    def predict(a):
        return [cal.continuous(model, roof, hbm, i, o, c, achieved=a).itl for i, o, c in cases]

    assert cal.fit_achieved(predict, predict(truth)) == truth


def test_a_field_no_row_reads_stays_at_the_roof():
    model = st.served_model("Llama-3-8B")
    roof = st.Roof.of("H100-SXM", "bf16")
    fit = cal.fit_achieved(lambda a: [st.prefill_seconds(model, 4096, roof) / a.prefill], [0.1])
    assert fit.decode == fit.latency_decode == 1.0
    assert fit.prefill == pytest.approx(st.prefill_seconds(model, 4096, roof) / 0.1, abs=0.006)


@pytest.mark.parametrize("call, message", [
    (lambda: cal.continuous(FP8_70B, ROOF_2, HBM_2, 5000, 500, achieved=cal.Achieved(0.5, 1.2, 0.5)),
     r"achieved.decode must be a fraction in \(0, 1\]"),
    (lambda: cal.continuous(FP8_70B, ROOF_2, HBM_2, 5000, 500, concurrency=0), "concurrency"),
    (lambda: cal.continuous(FP8_70B, ROOF_2, HBM_2, 5000, 500, max_batch=0), "max_batch"),
    (lambda: cal.kv_batch_limit(FP8_70B, HBM_2, 5500, kv_memory_fraction=0), r"kv_memory_fraction must be in \(0, 1\]"),
    (lambda: cal.kv_batch_limit(FP8_70B, 40e9, 5500), "the weights .* do not fit in 40.0 GB"),
    (lambda: cal.continuous(FP8_70B, ROOF_2, 80e9, 500_000, 500_000), "not one sequence of 1000000 tokens fits"),
    (lambda: cal.fit_achieved(lambda a: [1.0], []), "at least one published value"),
    (lambda: cal.fit_achieved(lambda a: [1.0, 2.0], [1.0]), "predict returned 2 values for 1 published"),
])
def test_bad_inputs_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_no_tokens_out_has_no_gap():
    assert math.isinf(cal.continuous(FP8_70B, ROOF_2, HBM_2, 5000, 1, concurrency=1).itl)
