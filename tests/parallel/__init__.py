"""Tests of utils.parallel, one file per module; helpers the multi-rank tests share."""

from typing import Callable, Sequence


def value_error_messages(attempts: Sequence[Callable[[], object]]) -> list:
    """Run each attempt; its ValueError's message, or None where it raised nothing (for tests on ranks)."""
    messages = []
    for attempt in attempts:
        try:
            attempt()
            messages.append(None)
        except ValueError as exc:
            messages.append(str(exc))
    return messages
