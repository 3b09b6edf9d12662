"""Progress bars that move in a live notebook and leave one line in a stored one.

A training loop of the RL labs runs for tens of seconds on a laptop CPU, so a reader
wants to see it move. ``tqdm.auto`` draws an ipywidgets bar in live Jupyter and a
text bar in a terminal. But a notebook executed without a person watching (the book
build, ``make execute``, CI) would store every redraw of a text bar, carriage
returns and rates included, and the HTML would show that noise.

:func:`progress` therefore looks at :data:`BATCH_VARIABLE`. The book's executors
set it (the Makefile exports it for every target but ``make lab``); then no bar is
drawn and one line is printed when the loop ends, ``"<desc>: <n>/<total>"`` (no
time or rate, so the stored output is the same on every machine). Without it the
loop gets ``tqdm.auto``'s bar.
"""

from __future__ import annotations

import os
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")

BATCH_VARIABLE = "BOOK_BATCH_EXECUTION"
"""Set to ``1`` by the book's executors: a notebook is run with no one watching, so no live bar."""


def batch_execution() -> bool:
    """True when notebooks are being executed unattended (``BOOK_BATCH_EXECUTION=1``)."""
    return os.environ.get(BATCH_VARIABLE, "0") == "1"


def progress(iterable: Iterable[T], desc: str, total: int | None = None, mininterval: float = 1.0) -> Iterator[T]:
    """Yield the items of ``iterable`` while showing a progress bar labelled ``desc``.

    Live (no :data:`BATCH_VARIABLE`): ``tqdm.auto.tqdm`` redrawn at most every
    ``mininterval`` seconds. Unattended: nothing while the loop runs, then the line
    ``"<desc>: <done>/<total>"`` on stdout once it ends (``<done>`` alone when the
    length is unknown). ``total`` defaults to ``len(iterable)`` where it has one.
    """
    if not desc:
        raise ValueError("progress: desc must name the loop (it labels the bar), got an empty string")
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if total is not None and total < 0:
        raise ValueError(f"progress: total must be >= 0 (the number of items), got {total}")
    if not batch_execution():
        from tqdm.auto import tqdm

        yield from tqdm(iterable, desc=desc, total=total, mininterval=mininterval)
        return
    done = 0
    for item in iterable:
        yield item
        done += 1
    print(f"{desc}: {done}/{total}" if total is not None else f"{desc}: {done}", flush=True)
