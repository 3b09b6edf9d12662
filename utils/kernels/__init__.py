"""Triton kernels of the labs, with their launchers: the reference implementations the benchmarks reuse.

Import each module by its path (``from utils.kernels.softmax import softmax``).
One launcher is also re-exported here, under the name part 3 gives it:
``utils.kernels.flash_attention(q, k, v, causal=False, sm_scale=None)`` is
:func:`utils.kernels.flash_attention.flash_attention` (the function shadows
the module's name on this package; ``from utils.kernels.flash_attention import
...`` still reaches the module).
"""

from utils.kernels.flash_attention import flash_attention

__all__ = ["flash_attention"]
