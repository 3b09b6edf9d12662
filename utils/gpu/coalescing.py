"""Coalescing: how the 32 loads of a warp become 32-byte memory sectors, and how many bytes are wasted.

A warp's 32 loads are served in 32-byte *sectors* (four per
128-byte cache line). :func:`sectors_per_warp_request` counts the sectors a
strided access touches and :func:`coalescing_efficiency` the fraction of the
moved bytes the warp asked for (CUDA C++ Best Practices Guide, "Coalesced
Access to Global Memory": on compute capability 6.0 and later "the concurrent
accesses of the threads of a warp will coalesce into a number of transactions
equal to the number of 32-byte transactions necessary to service all of the
threads of the warp").

The latencies and bandwidths of the memory these sectors come from are in
:mod:`utils.gpu.memory_hierarchy`.
"""

from __future__ import annotations

from utils.gpu.hardware import WARP_SIZE
from utils.validate import check_positive_int

SECTOR_BYTES = 32
"""Granularity of a global-memory transaction on compute capability 6.0+ (CUDA C++ Best Practices Guide)."""
LINE_BYTES = 128
"""L1/L2 cache line: four 32-byte sectors (CUDA C++ Programming Guide, compute capability 7.x+ global memory)."""
ELEMENT_BYTES = (1, 2, 4, 8, 16)
"""Sizes of one thread's load that CUDA supports natively (char up to float4 / 16-byte vector loads)."""


def _check_access(stride_elements: int, element_bytes: int, offset_bytes: int, n_threads: int,
                  sector_bytes: int) -> None:
    for value, what in ((stride_elements, "stride_elements"), (element_bytes, "element_bytes"),
                        (offset_bytes, "offset_bytes"), (n_threads, "n_threads"), (sector_bytes, "sector_bytes")):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{what} must be an int, got {value!r}")
    check_positive_int("stride_elements (1 = consecutive elements)", stride_elements)
    if element_bytes not in ELEMENT_BYTES:
        raise ValueError(f"element_bytes must be one of {ELEMENT_BYTES}, got {element_bytes}")
    if offset_bytes < 0 or offset_bytes % element_bytes:
        raise ValueError(f"offset_bytes must be >= 0 and a multiple of element_bytes={element_bytes} "
                         f"(loads are naturally aligned), got {offset_bytes}")
    if not 1 <= n_threads <= WARP_SIZE:
        raise ValueError(f"n_threads must be in 1..{WARP_SIZE}, got {n_threads}")
    if sector_bytes < 1 or sector_bytes & (sector_bytes - 1):
        raise ValueError(f"sector_bytes must be a positive power of two, got {sector_bytes}")


def warp_sectors(stride_elements: int, element_bytes: int, offset_bytes: int = 0, n_threads: int = WARP_SIZE,
                 sector_bytes: int = SECTOR_BYTES) -> tuple[int, ...]:
    """Sorted indices of the ``sector_bytes`` sectors a warp's strided load touches.

    Thread ``i`` loads bytes ``[a_i, a_i + element_bytes)`` with
    ``a_i = offset_bytes + i * stride_elements * element_bytes``; the sectors
    are ``a // sector_bytes`` over every byte loaded.
    """
    _check_access(stride_elements, element_bytes, offset_bytes, n_threads, sector_bytes)
    sectors = set()
    for i in range(n_threads):
        first = offset_bytes + i * stride_elements * element_bytes
        last = first + element_bytes - 1
        sectors.update(range(first // sector_bytes, last // sector_bytes + 1))
    return tuple(sorted(sectors))


def sectors_per_warp_request(stride_elements: int, element_bytes: int, offset_bytes: int = 0,
                             n_threads: int = WARP_SIZE, sector_bytes: int = SECTOR_BYTES) -> int:
    """Number of 32-byte sectors (transactions) one warp's strided load needs.

    Unit stride, 4-byte elements, aligned: 32 * 4 / 32 = 4 sectors. Stride 32
    (or more): one sector per thread, 32 sectors. Shifting a unit-stride fp32
    load by 4 bytes: 5 sectors (CUDA C++ Best Practices Guide, "A Sequential
    but Misaligned Access Pattern"). Pass ``sector_bytes=64`` to model a CPU's
    64-byte cache lines.
    """
    return len(warp_sectors(stride_elements, element_bytes, offset_bytes, n_threads, sector_bytes))


def coalescing_efficiency(stride_elements: int, element_bytes: int, offset_bytes: int = 0,
                          n_threads: int = WARP_SIZE, sector_bytes: int = SECTOR_BYTES) -> float:
    """Bytes the warp asked for / bytes moved: ``n_threads * element_bytes / (sectors * sector_bytes)``.

    1.0 for aligned unit stride; 0.5 for stride 2 (CUDA C++ Best Practices
    Guide, "Strided Accesses": "a stride of 2 results in a 50% of load/store
    efficiency"); ``element_bytes / 32`` once every thread needs its own sector.
    """
    sectors = sectors_per_warp_request(stride_elements, element_bytes, offset_bytes, n_threads, sector_bytes)
    return n_threads * element_bytes / (sectors * sector_bytes)
