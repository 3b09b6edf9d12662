"""utils.validate: one rule per kind of input, the same message everywhere."""

import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from utils.validate import (ELEMENT_SIZES, check_element_size, check_nonnegative, check_nonnegative_int,
                            check_positive, check_positive_int)


@given(st.integers(1, 10**12))
def test_positive_ints_pass_and_come_back_as_int(n):
    assert check_positive_int("n", n) == n
    assert type(check_positive_int("n", np.int64(n))) is int


@pytest.mark.parametrize("value", [0, -3, 2.0, 1.5, True, False, "4", None, float("nan")])
def test_anything_else_is_not_a_positive_int(value):
    with pytest.raises(ValueError, match=rf"^n_gpus must be a positive int, got {re.escape(repr(value))}$"):
        check_positive_int("n_gpus", value)


def test_nonnegative_int_allows_zero_and_refuses_bool():
    assert check_nonnegative_int("n_elements", 0) == 0
    for value in (-1, True, 1.0):
        with pytest.raises(ValueError, match="n_elements must be an int >= 0"):
            check_nonnegative_int("n_elements", value)


@given(st.floats(min_value=1e-300, allow_nan=False))
def test_positive_numbers_pass_infinity_included(x):
    assert check_positive("bandwidth (bytes/s)", x) == x


@pytest.mark.parametrize("value", [0, 0.0, -1e-9, float("nan"), True, "1", None])
def test_zero_negative_nan_bool_and_non_numbers_are_refused(value):
    with pytest.raises(ValueError, match=r"bandwidth \(bytes/s\) must be a number > 0, got"):
        check_positive("bandwidth (bytes/s)", value)


def test_finite_refuses_infinity_and_says_so():
    assert check_positive("lr", math.inf) == math.inf
    with pytest.raises(ValueError, match="lr must be a finite number > 0, got inf"):
        check_positive("lr", math.inf, finite=True)
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        check_nonnegative("grad_nbytes[3]", math.inf, finite=True)


def test_nonnegative_numbers():
    assert check_nonnegative("nbytes", 0) == 0.0
    assert check_nonnegative("nbytes", np.float64(2.5)) == 2.5
    with pytest.raises(ValueError, match="nbytes must be a number >= 0, got -1"):
        check_nonnegative("nbytes", -1)


def test_element_sizes():
    assert [check_element_size(b) for b in ELEMENT_SIZES] == [1, 2, 4, 8]
    for value in (3, 16, 4.0, True):
        with pytest.raises(ValueError, match="element_size must be 1, 2, 4 or 8 bytes"):
            check_element_size(value)
