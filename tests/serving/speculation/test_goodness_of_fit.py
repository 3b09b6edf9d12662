import pytest
import torch

from utils.serving.speculation.goodness_of_fit import chi_square_critical, chi_square_statistic


@pytest.mark.parametrize("dof, significance, table", [(4, 1e-3, 18.467), (10, 1e-3, 29.588), (30, 1e-3, 59.703),
                                                      (4, 0.05, 9.488), (20, 0.01, 37.566)])
def test_critical_values_match_the_nist_table(dof, significance, table):
    # NIST/SEMATECH e-Handbook of Statistical Methods, section 1.3.6.7.4 (upper critical values of chi-square)
    assert chi_square_critical(dof, significance) == pytest.approx(table, rel=0.015)


def test_statistic_by_hand_and_pooling():
    stat, dof = chi_square_statistic(torch.tensor([30, 20, 50]), torch.tensor([0.25, 0.25, 0.5]))
    assert dof == 2 and stat == pytest.approx(5 ** 2 / 25 + 5 ** 2 / 25 + 0)
    # expected counts 1 and 1 (< 5) are pooled into one cell of expected 2 and observed 3
    stat, dof = chi_square_statistic(torch.tensor([48, 49, 2, 1]), torch.tensor([0.49, 0.49, 0.01, 0.01]))
    assert dof == 2 and stat == pytest.approx(1 / 49 + 0 + 1 / 2)


def test_impossible_sample_is_infinite_and_seeded_fair_die_passes():
    assert chi_square_statistic(torch.tensor([5, 5, 1]), torch.tensor([0.5, 0.5, 0.0]))[0] == float("inf")
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    counts = torch.bincount(torch.multinomial(probs, 20000, replacement=True, generator=g), minlength=4)
    stat, dof = chi_square_statistic(counts, probs)
    assert stat < chi_square_critical(dof, 1e-3)
    wrong = torch.tensor([0.12, 0.2, 0.3, 0.38], dtype=torch.float64)
    assert chi_square_statistic(counts, wrong)[0] > chi_square_critical(dof, 1e-3)


@pytest.mark.parametrize("counts, probs", [([1, 2], [0.5, 0.25, 0.25]), ([-1, 2], [0.5, 0.5]), ([1, 2], [0.7, 0.7]),
                                           ([0, 0], [0.5, 0.5])])
def test_bad_inputs(counts, probs):
    with pytest.raises(ValueError):
        chi_square_statistic(torch.tensor(counts), torch.tensor(probs))


@pytest.mark.parametrize("dof, significance", [(0, 0.01), (3, 0.0), (3, 1.0)])
def test_bad_critical_inputs(dof, significance):
    with pytest.raises(ValueError):
        chi_square_critical(dof, significance)
