"""One comparison of a calculator with a published figure: the :class:`Entry` declared, the :class:`Record` computed.

An :class:`Entry` holds everything about a comparison except the prediction:
which calculator, what run, where it was published, the inputs read from the
same source, the published value and what the model leaves out. Its
``predict`` is a thunk that calls the book's own function; :meth:`Entry.evaluate`
runs it and returns a :class:`Record` with the predicted value and the relative
error ``predicted / published - 1``. Nothing predicted is ever typed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

SPLITS = ("fit", "holdout")
"""``"fit"``: a constant of the calculator was fitted on this row; ``"holdout"``: nothing was."""


def _check_text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _check_value(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _frozen_inputs(inputs: object) -> Mapping[str, object]:
    if not isinstance(inputs, Mapping) or not inputs:
        raise ValueError(f"inputs must be a non-empty mapping of the run's inputs (name -> value), got {inputs!r}")
    if not all(isinstance(key, str) and key for key in inputs):
        raise ValueError(f"every input needs a non-empty string name, got {list(inputs)!r}")
    return MappingProxyType(dict(inputs))


@dataclass(frozen=True)
class _Comparison:
    """What a row and its record share: the calculator, the run, its source and inputs, the published value."""

    calculator: str
    run: str
    source: str
    inputs: Mapping[str, object]
    quantity: str
    unit: str
    published: float


@dataclass(frozen=True)
class Record(_Comparison):
    """A published measurement next to what the book's calculator predicts for it.

    ``relative_error`` is ``predicted / published - 1``: for a rate (TFLOP/s,
    tokens/s, GB/s) +0.10 means the calculator is 10 % optimistic; for a time
    or a memory it means 10 % too much. ``split`` is one of :data:`SPLITS`.
    ``omits`` names what the run had that the model leaves out, and how far
    each would move the number where that is known.
    """

    predicted: float
    relative_error: float
    split: str
    omits: str

    @property
    def abs_error(self) -> float:
        """``|predicted / published - 1|``."""
        return abs(self.relative_error)


@dataclass(frozen=True)
class Entry(_Comparison):
    """A row before its prediction is computed: ``predict()`` calls the calculator and returns a number > 0."""

    predict: Callable[[], float]
    split: str
    omits: str

    def __post_init__(self) -> None:
        for name in ("calculator", "run", "source", "quantity", "unit", "omits"):
            _check_text(name, getattr(self, name))
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {self.split!r} (row {self.run!r})")
        _check_value(f"published (row {self.run!r})", self.published)
        if not callable(self.predict):
            raise ValueError(f"predict must be a function of no arguments that calls the calculator, "
                             f"got {self.predict!r} (row {self.run!r})")
        object.__setattr__(self, "inputs", _frozen_inputs(self.inputs))

    def evaluate(self) -> Record:
        """Call the calculator and return the :class:`Record`; ``ValueError`` if it returns no number > 0."""
        predicted = self.predict()
        try:
            predicted = _check_value("predicted", predicted)
        except ValueError as err:
            raise ValueError(f"the {self.calculator} row {self.run!r}: {err}") from None
        return Record(self.calculator, self.run, self.source, self.inputs, self.quantity, self.unit,
                      float(self.published), predicted, predicted / self.published - 1, self.split, self.omits)
