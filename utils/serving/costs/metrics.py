"""The latency metrics of an inference server, from the times at which a request's tokens appear.

A request arrives at ``t_arrival`` and its output tokens appear at
``t_1 <= t_2 <= ... <= t_n``. Then (the definitions vLLM's and SGLang's
benchmark scripts print, and DistServe's, Zhong et al. 2024, arXiv:2401.09670):

- **TTFT**, time to first token: ``t_1 - t_arrival`` (queueing plus prefill);
- **ITL**, inter-token latencies: ``t_{i+1} - t_i``, one per later token;
- **TPOT**, time per output token: ``(t_n - t_1) / (n - 1)``, the mean ITL of
  one request (undefined for ``n = 1``);
- **end-to-end latency**: ``t_n - t_arrival = TTFT + (n - 1) TPOT``;
- **SLO attainment**: the share of requests that meet both a TTFT and a TPOT
  bound (their service-level objectives);
- **goodput** (DistServe, section 2): "the maximum request rate that can be
  served adhering to the SLO attainment goal (say, 90%)", found by serving a
  workload at several rates.

The same functions take seconds or engine steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from utils.validate import check_positive

__all__ = ["RequestTimes", "goodput", "inter_token_latencies", "slo_attainment", "time_per_output_token",
           "time_to_first_token"]


def _check_times(arrival: float, token_times: Sequence[float]) -> None:
    if not token_times:
        raise ValueError("token_times is empty: a request's metrics need at least one output token")
    if token_times[0] < arrival or any(b < a for a, b in zip(token_times, token_times[1:])):
        raise ValueError(f"token times must not decrease and must not precede the arrival ({arrival}); "
                         f"got {list(token_times)[:5]}...")


def time_to_first_token(arrival: float, token_times: Sequence[float]) -> float:
    """TTFT: ``t_1 - t_arrival``."""
    _check_times(arrival, token_times)
    return token_times[0] - arrival


def inter_token_latencies(token_times: Sequence[float]) -> list[float]:
    """ITL: ``t_{i+1} - t_i`` for every output token after the first."""
    _check_times(token_times[0] if token_times else 0.0, token_times)
    return [b - a for a, b in zip(token_times, token_times[1:])]


def time_per_output_token(token_times: Sequence[float]) -> float | None:
    """TPOT: ``(t_n - t_1) / (n - 1)``, the mean inter-token latency; ``None`` for a one-token output."""
    _check_times(token_times[0] if token_times else 0.0, token_times)
    n = len(token_times)
    return None if n == 1 else (token_times[-1] - token_times[0]) / (n - 1)


@dataclass(frozen=True)
class RequestTimes:
    """A finished request's arrival and the time each of its output tokens appeared (seconds or steps)."""

    arrival: float
    token_times: tuple[float, ...]

    @property
    def ttft(self) -> float:
        return time_to_first_token(self.arrival, self.token_times)

    @property
    def tpot(self) -> float | None:
        return time_per_output_token(self.token_times)

    @property
    def latency(self) -> float:
        """End-to-end latency ``t_n - t_arrival``."""
        return self.token_times[-1] - self.arrival


def slo_attainment(requests: Sequence[RequestTimes], ttft_slo: float, tpot_slo: float) -> float:
    """The share of ``requests`` whose TTFT <= ``ttft_slo`` and TPOT <= ``tpot_slo`` (a one-token request has no
    TPOT and meets that bound)."""
    check_positive("ttft_slo", ttft_slo)
    check_positive("tpot_slo", tpot_slo)
    if not requests:
        raise ValueError("slo_attainment needs at least one request")
    met = sum(r.ttft <= ttft_slo and (r.tpot is None or r.tpot <= tpot_slo) for r in requests)
    return met / len(requests)


def goodput(rates: Sequence[float], attainments: Sequence[float], goal: float = 0.9) -> float:
    """DistServe's goodput: the highest request rate the server sustains with SLO attainment at least ``goal``.

    ``attainments[i]`` is :func:`slo_attainment` of the workload served at ``rates[i]``. The rates are taken
    in increasing order and the count stops at the first that misses the goal: a rate that passes above a
    failing one (the noise of one trace) is not sustained. 0 if the lowest rate fails. Zhong et al. 2024
    (arXiv:2401.09670), section 2, defines it as the maximum request rate served while meeting the SLO
    attainment goal. Not vLLM's ``--goodput`` (its benchmark), which counts the requests per second that
    met their SLOs at one offered rate.
    """
    if len(rates) != len(attainments) or not rates:
        raise ValueError(f"rates and attainments must be non-empty and of one length, got {len(rates)} and "
                         f"{len(attainments)}")
    if not 0 < goal <= 1:
        raise ValueError(f"goal must lie in (0, 1], got {goal}")
    sustained = 0.0
    for rate, share in sorted(zip(rates, attainments)):
        if share < goal:
            break
        sustained = rate
    return sustained
