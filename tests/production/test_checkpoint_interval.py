"""Checkpoint intervals: Young's and Daly's formulas by hand and against Daly's own figures, goodput, cluster MTBF."""

import math

import pytest

from utils.production import checkpoint_interval as ci

MINUTE, HOUR = 60.0, 3600.0


def test_young_by_hand():
    """5 minutes to save, a failure a day: sqrt(2 x 300 x 86400) = 7200 s, two hours."""
    assert ci.young_interval(5 * MINUTE, 24 * HOUR) == pytest.approx(2 * HOUR, rel=1e-15)


@pytest.mark.parametrize("mtbf, published_minutes, digits", [(24 * HOUR, 117, 0), (6 * HOUR, 57, 0), (15 * MINUTE, 9.1, 1)])
def test_daly_matches_his_figures_3_to_5(mtbf, published_minutes, digits):
    """Daly 2006, Figs. 3-5 (delta = 5 min): 117, 57 and 9.1 minutes; the direct minimum agrees to 0.5 %."""
    tau = ci.daly_interval(5 * MINUTE, mtbf)
    assert round(tau / MINUTE, digits) == published_minutes
    assert ci.best_interval(5 * MINUTE, mtbf) == pytest.approx(tau, rel=5e-3)


def test_daly_by_hand_and_its_cap():
    """M = 24 h, delta = 5 min: x = 300 / 172800, tau = 7200 (1 + sqrt(x)/3 + x/9) - 300 s."""
    x = 300 / (2 * 24 * HOUR)
    assert ci.daly_interval(300, 24 * HOUR) == pytest.approx(7200 * (1 + math.sqrt(x) / 3 + x / 9) - 300, rel=1e-15)
    assert ci.daly_interval(2 * HOUR, 1 * HOUR) == 1 * HOUR  # a save of 2M or more: checkpoint once per M
    assert ci.daly_interval(5 * MINUTE, 24 * HOUR) < ci.young_interval(5 * MINUTE, 24 * HOUR)


def test_wall_time_by_hand_and_without_failures():
    """T_w = M e^(R/M) (e^((tau + delta)/M) - 1) T_s / tau, and T_s (1 + delta/tau) when failures vanish."""
    m, r, tau, delta, ts = 10 * HOUR, 600.0, HOUR, 120.0, 100 * HOUR
    expected = m * math.exp(r / m) * (math.exp((tau + delta) / m) - 1) * ts / tau
    assert ci.expected_wall_seconds(ts, tau, delta, m, r) == pytest.approx(expected, rel=1e-14)
    assert ci.expected_wall_seconds(ts, tau, delta, 1e15) == pytest.approx(ts * (1 + delta / tau), rel=1e-6)
    assert ci.goodput(tau, delta, m, r) == pytest.approx(ts / expected, rel=1e-14)


def test_the_best_interval_maximises_goodput_and_restart_does_not_move_it():
    best = ci.best_interval(5 * MINUTE, 6 * HOUR)
    for tau in (0.5 * best, 0.9 * best, 1.1 * best, 2 * best):
        assert ci.goodput(tau, 5 * MINUTE, 6 * HOUR) < ci.goodput(best, 5 * MINUTE, 6 * HOUR)
    assert ci.goodput(best, 5 * MINUTE, 6 * HOUR, restart_seconds=600) < ci.goodput(best, 5 * MINUTE, 6 * HOUR)


def test_cluster_mtbf_and_llama3():
    """419 unexpected interruptions in 54 days: one every 3.09 hours on 16,384 GPUs, 5.8 years per GPU."""
    job = ci.llama3_job_mtbf_seconds()
    assert job == pytest.approx(54 * 86400 / 419, rel=1e-15)
    assert 3.0 * HOUR < job < 3.2 * HOUR
    per_gpu = job * 16_384
    assert ci.cluster_mtbf(per_gpu, 16_384) == pytest.approx(job, rel=1e-15)
    assert ci.cluster_mtbf(per_gpu, 2 * 16_384) == pytest.approx(job / 2, rel=1e-15)
    assert 5.7 < per_gpu / (365 * 86400) < 5.9


@pytest.mark.parametrize("call, message", [
    (lambda: ci.young_interval(0, HOUR), "save_seconds must be a finite number > 0"),
    (lambda: ci.daly_interval(60, -1), "mtbf_seconds must be a finite number > 0"),
    (lambda: ci.daly_interval(math.inf, HOUR), "save_seconds must be a finite number > 0"),
    (lambda: ci.expected_wall_seconds(HOUR, 0, 60, HOUR), "interval_seconds must be a finite number > 0"),
    (lambda: ci.expected_wall_seconds(HOUR, 60, -1, HOUR), "save_seconds must be a finite number >= 0"),
    (lambda: ci.goodput(60, 60, HOUR, restart_seconds=-5), "restart_seconds must be a finite number >= 0"),
    (lambda: ci.cluster_mtbf(HOUR, 0), "n_parts must be a positive int"),
])
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_an_interval_far_beyond_the_mtbf_never_finishes():
    assert ci.expected_wall_seconds(HOUR, 1000 * HOUR, 60, HOUR) == math.inf
    assert ci.goodput(1000 * HOUR, 60, HOUR) == 0.0


def test_plot_goodput_marks_both_intervals():
    import matplotlib
    matplotlib.use("Agg")
    fig = ci.plot_goodput(save_seconds=60, gpus=16_384)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[0].startswith("Young: every") and labels[1].startswith("Daly: every")
