"""``triton`` and ``triton.language`` where Triton is installed, else :mod:`utils.no_triton`'s stand-ins.

Every kernel module takes them from here (``from utils.kernels.triton_or_stand_in import tl, triton``),
so that on macOS and Windows, where Triton has no wheels, the kernels are still defined and launching
one says why it cannot run (:data:`utils.device.NO_TRITON`).
"""

from utils.device import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl
else:
    from utils.no_triton import tl, triton

__all__ = ["tl", "triton"]
