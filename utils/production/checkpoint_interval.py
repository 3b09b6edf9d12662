"""How often a training run should checkpoint, and what failures cost it.

A run that checkpoints every ``tau`` seconds of work, taking ``delta`` seconds
per checkpoint, on a machine whose failures arrive as a Poisson process of
mean time between failures ``M`` (and that needs ``R`` seconds to restart after
each one), loses two things: the checkpoints themselves, and the work done
since the last checkpoint whenever a failure strikes. Checkpointing more often
trades the second for the first.

- **Young** (1974), to first order in ``delta / M``: ``tau = sqrt(2 delta M)``
  (:func:`young_interval`).
- **Daly** (2006) writes the expected wall time of a run of ``T_s`` seconds of
  work exactly, ``T_w = M exp(R / M) (exp((tau + delta) / M) - 1) T_s / tau``
  (:func:`expected_wall_seconds`), and solves for its minimum by perturbation:
  ``tau = sqrt(2 delta M) [1 + (1/3) sqrt(delta / (2M)) + (1/9) delta / (2M)]
  - delta`` for ``delta < 2M``, else ``tau = M`` (:func:`daly_interval`). His
  Figs. 3-5 give 117, 57 and 9.1 minutes for ``delta`` = 5 min and ``M`` =
  24 h, 6 h and 15 min (``tests/production/test_checkpoint_interval.py``
  checks all three, and that :func:`best_interval`, a direct minimisation of
  ``T_w``, agrees).

The fraction of the wall time spent on useful work, ``T_s / T_w``, is the
run's *goodput* (:func:`goodput`). Failures of ``n`` independent parts, each
with mean time between failures ``m``, arrive ``n`` times as often:
``M = m / n`` (:func:`cluster_mtbf`), which is why a 16,384-GPU job sees a
failure every few hours (:data:`LLAMA3_INTERRUPTIONS`).

Sources: J. W. Young, "A first order approximation to the optimum checkpoint
interval", Communications of the ACM 17(9), 1974; J. T. Daly, "A higher order
estimate of the optimum checkpoint interval for restart dumps", Future
Generation Computer Systems 22(3), 2006.
"""

from __future__ import annotations

import math
from typing import Any

from utils.published import Published
from utils.validate import check_nonnegative, check_positive, check_positive_int

LLAMA3 = "Llama 3 paper (Grattafiori et al. 2024, arXiv:2407.21783), section 3.3.4"
LLAMA3_INTERRUPTIONS: dict[str, Published] = {
    "days": Published(54, "days of the pre-training snapshot", f"{LLAMA3}, text"),
    "gpus": Published(16_384, "H100 GPUs", f"{LLAMA3}, text"),
    "interruptions": Published(466, "job interruptions", f"{LLAMA3}, text"),
    "planned": Published(47, "planned interruptions", f"{LLAMA3}, text"),
    "unexpected": Published(419, "unexpected interruptions", f"{LLAMA3}, text and Table 5"),
}
"""Llama 3's interruption counts over its 54-day snapshot on 16,384 H100s."""


def young_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Young's optimum interval between checkpoints, ``sqrt(2 delta M)`` seconds of work (first order)."""
    return math.sqrt(2 * _positive("save_seconds", save_seconds) * _positive("mtbf_seconds", mtbf_seconds))


def daly_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """Daly's higher-order optimum: ``sqrt(2 delta M) [1 + sqrt(x)/3 + x/9] - delta``, ``x = delta/(2M)``; ``M`` if ``delta >= 2M``."""
    delta, m = _positive("save_seconds", save_seconds), _positive("mtbf_seconds", mtbf_seconds)
    if delta >= 2 * m:
        return m
    x = delta / (2 * m)
    return math.sqrt(2 * delta * m) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def expected_wall_seconds(work_seconds: float, interval_seconds: float, save_seconds: float, mtbf_seconds: float,
                          restart_seconds: float = 0.0) -> float:
    """Daly's expected wall time of ``work_seconds`` of work: ``M exp(R/M) (exp((tau + delta)/M) - 1) T_s / tau``.

    Poisson failures of mean ``M``; each costs the restart ``R`` and the work
    since the last checkpoint. The time spent on checkpoints and on lost work
    both count; with no failures (``M`` large) it tends to ``T_s (1 + delta/tau)``.
    """
    ts = _positive("work_seconds", work_seconds)
    tau = _positive("interval_seconds", interval_seconds)
    delta = check_nonnegative("save_seconds", save_seconds, finite=True)
    m = _positive("mtbf_seconds", mtbf_seconds)
    r = check_nonnegative("restart_seconds", restart_seconds, finite=True)
    try:
        return m * math.exp(r / m) * math.expm1((tau + delta) / m) * ts / tau
    except OverflowError:  # an interval hundreds of times the MTBF: the run never finishes
        return math.inf


def goodput(interval_seconds: float, save_seconds: float, mtbf_seconds: float, restart_seconds: float = 0.0) -> float:
    """The share of wall time spent on useful work, ``T_s / T_w`` (independent of ``T_s``)."""
    return 1 / expected_wall_seconds(1.0, interval_seconds, save_seconds, mtbf_seconds, restart_seconds)  # 1/inf = 0


def best_interval(save_seconds: float, mtbf_seconds: float) -> float:
    """The interval that minimises :func:`expected_wall_seconds`, found by golden-section search (to 1e-9 relative).

    ``T_w / T_s`` is ``(exp((tau + delta)/M) - 1) / tau`` times a constant, convex in ``tau`` with its
    minimum below ``10 (M + delta)``; the restart time only scales it, so it does not move the minimum.
    """
    delta, m = _positive("save_seconds", save_seconds), _positive("mtbf_seconds", mtbf_seconds)
    lo, hi = 1e-9 * m, 10 * m + 10 * delta
    inv = (math.sqrt(5) - 1) / 2
    a, b = hi - inv * (hi - lo), lo + inv * (hi - lo)
    f = lambda tau: expected_wall_seconds(1.0, tau, delta, m)  # noqa: E731
    fa, fb = f(a), f(b)
    while hi - lo > 1e-9 * (lo + hi):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - inv * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + inv * (hi - lo)
            fb = f(b)
    return (lo + hi) / 2


def cluster_mtbf(part_mtbf_seconds: float, n_parts: int) -> float:
    """Mean time between failures of ``n_parts`` independent parts, each of mean ``m``: ``m / n`` (Poisson rates add)."""
    return _positive("part_mtbf_seconds", part_mtbf_seconds) / check_positive_int("n_parts", n_parts)


def llama3_job_mtbf_seconds() -> float:
    """Seconds between Llama 3's unexpected interruptions: 54 days over 419 (about 3.1 hours)."""
    figures = LLAMA3_INTERRUPTIONS
    return figures["days"].value * 86_400 / figures["unexpected"].value


def _positive(name: str, value: float) -> float:
    return check_positive(name, value, finite=True)


YEAR = 365 * 86_400.0


def plot_goodput(save_seconds: float = 60.0, gpus: int = 16_384, gpu_mtbf_years: float = 5.8,
                 restart_seconds: float = 600.0) -> Any:
    """Goodput against the interval for one cluster (Young's and Daly's intervals marked), and the best goodput
    against the cluster's size, for GPUs that each fail once per ``gpu_mtbf_years`` on average."""
    import matplotlib.pyplot as plt

    m = cluster_mtbf(_positive("gpu_mtbf_years", gpu_mtbf_years) * YEAR, check_positive_int("gpus", gpus))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.3))
    taus = [save_seconds * 2 ** (k / 4) for k in range(0, 4 * 14)]
    left.semilogx([t / 60 for t in taus], [goodput(t, save_seconds, m, restart_seconds) for t in taus], color="#4c72b0")
    for name, tau, marker in (("Young", young_interval(save_seconds, m), "o"),
                              ("Daly", daly_interval(save_seconds, m), "s")):
        left.plot(tau / 60, goodput(tau, save_seconds, m, restart_seconds), marker, color="#c44e52",
                  label=f"{name}: every {tau / 60:.1f} min")
    left.set(xlabel="minutes of work between checkpoints", ylabel="goodput (useful share of wall time)",
             title=f"{gpus:,} GPUs: a failure every {m / 3600:.1f} h, save {save_seconds:g} s")
    left.legend(fontsize=8)
    sizes = [2 ** k for k in range(8, 18)]
    best = [goodput(daly_interval(save_seconds, cluster_mtbf(gpu_mtbf_years * YEAR, n)), save_seconds,
                    cluster_mtbf(gpu_mtbf_years * YEAR, n), restart_seconds) for n in sizes]
    right.semilogx(sizes, best, "o-", color="#55a868")
    right.axvline(gpus, color="0.6", lw=0.8, ls="--")
    right.set(xlabel="GPUs in the job", ylabel="goodput at Daly's interval", title="the same GPUs, more of them")
    fig.tight_layout()
    return fig
