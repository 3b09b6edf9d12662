"""Input checks shared by every module: one definition of "a positive int", "a number > 0" and their kin.

Each check returns the value it accepted (as ``int`` or ``float``) and raises
``ValueError`` with a sentence that names the argument, says what is allowed
and shows what it got: ``n_gpus must be a positive int, got 0``. Give ``name``
the unit or meaning when it helps the reader:
``check_positive("bandwidth (bytes/s)", bandwidth)``.

``bool`` is refused everywhere (``True`` is an ``int`` to Python, never a count
to a reader). NumPy's integer and float scalars are accepted, since pages pass
values from ``np.arange`` and ``np.logspace``. NaN never passes. Infinity
passes the number checks unless ``finite=True``: an unlimited bandwidth or
bucket cap is a meaningful limit case.
"""

from __future__ import annotations

import math
from numbers import Integral, Real


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_number(value: object, finite: bool) -> bool:
    if not isinstance(value, Real) or isinstance(value, bool) or math.isnan(value):
        return False
    return not (finite and math.isinf(value))


def check_positive_int(name: str, value: object) -> int:
    """``value`` as an ``int`` if it is an integer >= 1, else ``ValueError``.

    The message: ``f"{name} must be a positive int, got {value!r}"``.
    """
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def check_nonnegative_int(name: str, value: object) -> int:
    """``value`` as an ``int`` if it is an integer >= 0, else ``ValueError``.

    The message: ``f"{name} must be an int >= 0, got {value!r}"``.
    """
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(value)


def check_positive(name: str, value: object, finite: bool = False) -> float:
    """``value`` as a ``float`` if it is a number > 0 (finite, if ``finite``), else ``ValueError``.

    The message: ``f"{name} must be a number > 0, got {value!r}"`` ("a finite number" if ``finite``).
    """
    if not _is_number(value, finite) or not value > 0:
        raise ValueError(f"{name} must be a {'finite ' if finite else ''}number > 0, got {value!r}")
    return float(value)


def check_nonnegative(name: str, value: object, finite: bool = False) -> float:
    """``value`` as a ``float`` if it is a number >= 0 (finite, if ``finite``), else ``ValueError``.

    The message: ``f"{name} must be a number >= 0, got {value!r}"`` ("a finite number" if ``finite``).
    """
    if not _is_number(value, finite) or not value >= 0:
        raise ValueError(f"{name} must be a {'finite ' if finite else ''}number >= 0, got {value!r}")
    return float(value)


ELEMENT_SIZES = (1, 2, 4, 8)
"""Bytes per element of the dtypes the kernels take (int8/fp8 up to fp64)."""


def check_element_size(element_size: object) -> int:
    """``element_size`` as an ``int`` if it is one of :data:`ELEMENT_SIZES`, else ``ValueError``."""
    if not _is_int(element_size) or element_size not in ELEMENT_SIZES:
        raise ValueError(f"element_size must be 1, 2, 4 or 8 bytes, got {element_size!r}")
    return int(element_size)
