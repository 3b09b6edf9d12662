import pytest

from utils.serving.costs.metrics import (RequestTimes, goodput, inter_token_latencies, slo_attainment,
                                   time_per_output_token, time_to_first_token)


def test_definitions_on_a_hand_timed_request():
    times = [1.5, 1.7, 2.0, 2.1]
    assert time_to_first_token(1.0, times) == pytest.approx(0.5)
    assert inter_token_latencies(times) == pytest.approx([0.2, 0.3, 0.1])
    assert time_per_output_token(times) == pytest.approx(0.6 / 3)
    r = RequestTimes(1.0, tuple(times))
    assert r.latency == pytest.approx(r.ttft + 3 * r.tpot)
    assert time_per_output_token([3.0]) is None


def test_attainment_counts_requests_meeting_both_bounds():
    fast = RequestTimes(0.0, (0.1, 0.2, 0.3))
    slow_start = RequestTimes(0.0, (2.0, 2.1))
    slow_tokens = RequestTimes(0.0, (0.1, 1.1))
    one_token = RequestTimes(0.0, (0.5,))
    reqs = [fast, slow_start, slow_tokens, one_token]
    assert slo_attainment(reqs, ttft_slo=1.0, tpot_slo=0.5) == pytest.approx(2 / 4)
    assert slo_attainment(reqs, ttft_slo=10, tpot_slo=10) == 1.0


def test_goodput_is_the_highest_rate_reaching_the_goal():
    assert goodput([1, 2, 4, 8], [1.0, 0.95, 0.9, 0.5]) == 4
    assert goodput([1, 2], [0.5, 0.2]) == 0.0
    assert goodput([1, 2, 4], [0.8, 0.85, 0.1], goal=0.8) == 2
    assert goodput([1, 2, 4, 8], [1.0, 0.5, 0.95, 0.2]) == 1  # 4 passes after 2 failed: not sustained
    assert goodput([8, 1, 4, 2], [0.2, 1.0, 0.95, 0.97]) == 4  # in any order


def test_bad_times_are_refused():
    with pytest.raises(ValueError, match="at least one"):
        time_to_first_token(0.0, [])
    with pytest.raises(ValueError, match="must not decrease"):
        time_per_output_token([1.0, 0.5])
    with pytest.raises(ValueError, match="precede"):
        time_to_first_token(2.0, [1.0])
    with pytest.raises(ValueError, match="one length"):
        goodput([1, 2], [0.5])
    with pytest.raises(ValueError, match="goal"):
        goodput([1], [1.0], goal=0)
    with pytest.raises(ValueError, match="at least one request"):
        slo_attainment([], ttft_slo=1, tpot_slo=1)
