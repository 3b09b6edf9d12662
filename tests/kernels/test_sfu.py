"""utils.kernels.sfu: the exponential chain equals PyTorch's, and refuses bad input."""

import pytest
import torch

from utils.device import device
from utils.kernels.sfu import exp2_chain, exp2_chain_reference


@pytest.mark.parametrize("n, iters", [(1, 1), (1000, 3), (3000, 8)])
def test_exp2_chain_matches_torch(n, iters):
    x = 0.01 * torch.rand(n, device=device())
    torch.testing.assert_close(exp2_chain(x, iters, block_size=256), exp2_chain_reference(x, iters),
                               rtol=1e-4, atol=1e-4)


def test_exp2_chain_converges_without_overflow():
    x = 0.01 * torch.rand(64, device=device())
    out = exp2_chain(x, 64)
    assert (out > 0.5 * 64).all() and (out < 64).all()  # every term in (0.5, 1): the chain nears 2^-v = v


def test_exp2_chain_refuses_bad_input():
    with pytest.raises(ValueError, match="float32"):
        exp2_chain(torch.ones(4, dtype=torch.float64, device=device()), 2)
    with pytest.raises(ValueError, match="iters"):
        exp2_chain(torch.ones(4, device=device()), 0)
