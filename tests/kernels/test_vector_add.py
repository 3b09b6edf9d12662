"""utils.kernels.vector_add: the Triton add kernel against torch, its error paths, its byte count."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from utils.device import INTERPRETER, device, manual_seed
from utils.kernels.vector_add import DEFAULT_BLOCK_SIZE, add, add_intensity, add_nbytes, grid_size


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n", [1, 1000, 1024, 3 * 1024 + 7])
def test_add_matches_torch_including_the_masked_last_block(n, dtype):
    manual_seed(0)
    x = torch.randn(n, device=device()).to(dtype)
    y = torch.randn(n, device=device()).to(dtype)
    z = add(x, y)
    assert z.dtype == dtype and z.shape == x.shape
    torch.testing.assert_close(z, x + y)


def test_add_keeps_the_shape_of_a_contiguous_matrix_and_uses_any_power_of_two_block():
    manual_seed(1)
    x = torch.randn(5, 37, device=device())
    y = torch.randn(5, 37, device=device())
    torch.testing.assert_close(add(x, y, block_size=64), x + y)


def test_add_of_an_empty_tensor_is_empty():
    x = torch.empty(0, device=device())
    assert add(x, x).numel() == 0


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 2500), block_size=st.sampled_from([128, 256, 1024]))
def test_add_is_exact_for_integers_stored_as_floats(n, block_size):
    # small integers add exactly in fp32, so every element must match bit for bit
    x = torch.arange(n, device=device(), dtype=torch.float32)
    y = torch.full((n,), 3.0, device=device())
    assert torch.equal(add(x, y, block_size=block_size), x + 3.0)


def test_grid_covers_every_element_with_one_partial_block():
    assert grid_size(1000, 256) == 4          # 3 full blocks + 1 block with 232 of 256 lanes live
    assert grid_size(1024, 256) == 4
    assert grid_size(1025, 256) == 5
    assert grid_size(0, 256) == 0
    assert grid_size(2**28) == 2**28 // DEFAULT_BLOCK_SIZE


@pytest.mark.parametrize("make_args, message", [
    (lambda d: (torch.ones(4, device=d), torch.ones(5, device=d)), "same shape"),
    (lambda d: (torch.ones(4, device=d), torch.ones(4, device=d, dtype=torch.float16)), "same dtype"),
    (lambda d: (torch.ones(4, 4, device=d).t(), torch.ones(4, 4, device=d)), "contiguous"),
    (lambda d: (torch.ones(4, device=d), [1.0, 1.0, 1.0, 1.0]), "torch.Tensor"),
])
def test_add_refuses_bad_inputs_with_a_clear_message(make_args, message):
    with pytest.raises(ValueError, match=message):
        add(*make_args(device()))


@pytest.mark.parametrize("block_size", [0, 100, -256, 2.0])
def test_add_refuses_a_block_size_that_is_not_a_power_of_two(block_size):
    x = torch.ones(8, device=device())
    with pytest.raises(ValueError, match="power of two"):
        add(x, x, block_size=block_size)


@pytest.mark.skipif(not INTERPRETER, reason="bfloat16 is refused only under the interpreter")
def test_add_refuses_bfloat16_under_the_interpreter():
    x = torch.ones(8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16"):
        add(x, x)


def test_bytes_and_intensity_match_the_count_of_two_loads_and_one_store():
    # 2**28 fp32 elements: 3 arrays of 1 GiB
    assert add_nbytes(2**28, 4) == 3 * 2**30
    assert add_nbytes(1000, 2) == 6000
    assert add_intensity(4) == pytest.approx(1 / 12)   # 1 FLOP per 12 bytes for fp32
    assert add_intensity(2) == pytest.approx(1 / 6)
    with pytest.raises(ValueError, match="element_size"):
        add_nbytes(10, 3)
    with pytest.raises(ValueError, match="n_elements"):
        add_nbytes(-1, 4)
