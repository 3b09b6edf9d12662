import pytest

from utils.serving.metrics import (RequestTimes, goodput, inter_token_latencies, time_per_output_token,
                                   time_to_first_token)


def test_definitions_on_a_hand_timed_request():
    times = [1.5, 1.7, 2.0, 2.1]
    assert time_to_first_token(1.0, times) == pytest.approx(0.5)
    assert inter_token_latencies(times) == pytest.approx([0.2, 0.3, 0.1])
    assert time_per_output_token(times) == pytest.approx(0.6 / 3)
    r = RequestTimes(1.0, tuple(times))
    assert r.latency == pytest.approx(r.ttft + 3 * r.tpot)
    assert time_per_output_token([3.0]) is None


def test_goodput_counts_requests_meeting_both_bounds():
    fast = RequestTimes(0.0, (0.1, 0.2, 0.3))
    slow_start = RequestTimes(0.0, (2.0, 2.1))
    slow_tokens = RequestTimes(0.0, (0.1, 1.1))
    one_token = RequestTimes(0.0, (0.5,))
    reqs = [fast, slow_start, slow_tokens, one_token]
    assert goodput(reqs, duration=2.0, ttft_slo=1.0, tpot_slo=0.5) == pytest.approx(2 / 2.0)
    assert goodput(reqs, duration=2.0, ttft_slo=10, tpot_slo=10) == pytest.approx(4 / 2.0)


def test_bad_times_are_refused():
    with pytest.raises(ValueError, match="at least one"):
        time_to_first_token(0.0, [])
    with pytest.raises(ValueError, match="must not decrease"):
        time_per_output_token([1.0, 0.5])
    with pytest.raises(ValueError, match="precede"):
        time_to_first_token(2.0, [1.0])
    with pytest.raises(ValueError, match="duration"):
        goodput([], duration=0, ttft_slo=1, tpot_slo=1)
