"""Shared pytest setup: import utils first, so Triton's interpreter is on before any kernel is decorated."""

import utils  # noqa: F401

from hypothesis import settings  # noqa: E402

# Property tests draw the same examples on every run, so a CI run cannot fail on a draw the last one
# never made (a subnormal float once did); `pytest --hypothesis-profile=explore` draws new ones.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("ci")
