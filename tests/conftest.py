"""Shared pytest setup: import utils first, so Triton's interpreter is on before any kernel is decorated."""

import utils  # noqa: F401
