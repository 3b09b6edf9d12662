"""Shared code of the book *GPU systems for large language models*.

Importing :mod:`utils` is enough to make Triton kernels run on a machine
without a GPU: :mod:`utils.device` turns on Triton's interpreter
(``TRITON_INTERPRET=1``) before any kernel is decorated. Import ``utils``
before you define your first ``@triton.jit`` function.
"""

from utils import device  # noqa: F401  (side effect: interpreter switch)

__all__ = ["device"]
