"""Pearson's chi-square test: do sampled tokens follow a given distribution?

Speculative sampling promises that its tokens are distributed exactly as the
target's. A page checks such a promise by drawing ``n`` tokens and comparing the
counts ``O_i`` with the expected ``E_i = n p_i``:

``X^2 = sum_i (O_i - E_i)^2 / E_i``,

which, if the promise holds, follows a chi-square law with ``cells - 1`` degrees
of freedom for large ``n`` (Pearson 1900). Cells with ``E_i < 5`` are pooled into
one first, the usual rule for the approximation to hold. The critical value
uses the Wilson-Hilferty approximation (Wilson & Hilferty 1931):
``chi2_{1-a}(d) ~ d (1 - 2/(9d) + z_{1-a} sqrt(2/(9d)))^3``, good to about 1 % for
``d >= 3`` and at the small significance levels used here; no SciPy needed.
"""

from __future__ import annotations

from statistics import NormalDist

import torch

from utils.validate import check_positive_int

__all__ = ["chi_square_critical", "chi_square_statistic"]


def chi_square_statistic(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0
                         ) -> tuple[float, int]:
    """``(X^2, degrees of freedom)`` of ``counts`` (1-D, non-negative) against ``probs`` (1-D, sums to 1).

    Cells whose expected count ``n p_i`` is below ``min_expected`` are pooled into
    one cell (dropped if the pool's expectation is zero). A count in a cell of
    probability zero makes ``X^2`` infinite: the sample is impossible under ``probs``.
    """
    counts, probs = torch.as_tensor(counts, dtype=torch.float64), torch.as_tensor(probs, dtype=torch.float64)
    if counts.dim() != 1 or counts.shape != probs.shape:
        raise ValueError(f"counts and probs must be 1-D of the same length, got {tuple(counts.shape)} and "
                         f"{tuple(probs.shape)}")
    if bool((counts < 0).any()) or bool((probs < 0).any()) or abs(float(probs.sum()) - 1) > 1e-6:
        raise ValueError("counts must be >= 0 and probs a distribution (non-negative, summing to 1)")
    n = float(counts.sum())
    if n <= 0:
        raise ValueError("counts must hold at least one sample")
    if bool(((probs == 0) & (counts > 0)).any()):
        return float("inf"), max(1, int((probs > 0).sum()) - 1)
    expected = n * probs
    big = expected >= min_expected
    observed_cells, expected_cells = list(counts[big]), list(expected[big])
    if float(expected[~big].sum()) > 0:
        observed_cells.append(counts[~big].sum())
        expected_cells.append(expected[~big].sum())
    observed_t, expected_t = torch.stack(observed_cells), torch.stack(expected_cells)
    dof = len(expected_cells) - 1
    if dof < 1:
        raise ValueError("fewer than two cells have enough expected counts: draw more samples")
    return float(((observed_t - expected_t) ** 2 / expected_t).sum()), dof


def chi_square_critical(dof: int, significance: float = 1e-3) -> float:
    """The ``1 - significance`` quantile of a chi-square law with ``dof`` degrees of freedom (Wilson-Hilferty)."""
    check_positive_int("dof", dof)
    if not 0 < significance < 1:
        raise ValueError(f"significance must be in (0, 1), got {significance!r}")
    z = NormalDist().inv_cdf(1 - significance)
    h = 2 / (9 * dof)
    return dof * (1 - h + z * h ** 0.5) ** 3
