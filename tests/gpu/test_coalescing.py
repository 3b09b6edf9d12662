"""utils.gpu.coalescing: sectors per warp request against the CUDA Best Practices Guide's examples."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from utils.gpu.coalescing import ELEMENT_BYTES, SECTOR_BYTES, coalescing_efficiency, sectors_per_warp_request


@pytest.mark.parametrize("stride, element_bytes, sectors", [
    (1, 4, 4),     # fp32, consecutive: 128 bytes = 4 sectors
    (2, 4, 8),
    (32, 4, 32),   # every thread in its own sector
    (1, 2, 2),     # fp16: 64 bytes
    (1, 8, 8),     # fp64: 256 bytes
    (1, 16, 16),   # float4: 512 bytes
    (1, 1, 1),     # int8: 32 bytes
])
def test_sector_counts(stride, element_bytes, sectors):
    assert sectors_per_warp_request(stride, element_bytes) == sectors


def test_best_practices_guide_examples():
    # CUDA C++ Best Practices Guide: a sequential fp32 access shifted by one word needs five 32-byte segments,
    # and a stride of 2 gives 50% load efficiency.
    assert sectors_per_warp_request(1, 4, offset_bytes=4) == 5
    assert coalescing_efficiency(2, 4) == 0.5
    assert coalescing_efficiency(1, 4) == 1.0
    assert coalescing_efficiency(32, 4) == 4 / 32


def test_cpu_cache_lines():
    # With 64-byte lines, a unit-stride fp32 warp of 32 loads touches 2 lines, stride 16 touches 32.
    assert sectors_per_warp_request(1, 4, sector_bytes=64) == 2
    assert sectors_per_warp_request(16, 4, sector_bytes=64) == 32


@pytest.mark.parametrize("kwargs", [
    dict(stride_elements=0, element_bytes=4),
    dict(stride_elements=1, element_bytes=3),
    dict(stride_elements=1, element_bytes=4, offset_bytes=2),
    dict(stride_elements=1, element_bytes=4, n_threads=33),
    dict(stride_elements=1, element_bytes=4, sector_bytes=48),
    dict(stride_elements=1.5, element_bytes=4),
])
def test_bad_access_patterns_raise(kwargs):
    with pytest.raises(ValueError):
        sectors_per_warp_request(**kwargs)


@given(stride=st.integers(1, 100), element_bytes=st.sampled_from(ELEMENT_BYTES),
       offset_elements=st.integers(0, 64), n_threads=st.integers(1, 32))
def test_sector_count_bounds(stride, element_bytes, offset_elements, n_threads):
    sectors = sectors_per_warp_request(stride, element_bytes, offset_elements * element_bytes, n_threads)
    requested = n_threads * element_bytes
    assert sectors >= math.ceil(requested / SECTOR_BYTES)  # cannot move fewer bytes than asked for
    assert sectors <= n_threads * (math.ceil(element_bytes / SECTOR_BYTES) + 1)  # at most one straddle each
    assert 0 < coalescing_efficiency(stride, element_bytes, offset_elements * element_bytes, n_threads) <= 1


@given(stride=st.integers(1, 64), element_bytes=st.sampled_from(ELEMENT_BYTES))
def test_a_larger_stride_never_needs_fewer_sectors(stride, element_bytes):
    assert sectors_per_warp_request(stride + 1, element_bytes) >= sectors_per_warp_request(stride, element_bytes)
