"""utils.parallel.model.saved_activations: the bytes autograd saves, each storage once, parameters left out."""

import pytest
import torch
from torch import nn

from utils.parallel.model.saved_activations import saved_activation_bytes


def test_a_linear_saves_its_input_and_a_shared_input_counts_once():
    lin = nn.Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    _, saved = saved_activation_bytes(lambda: lin(x) + lin(x), exclude=lin.parameters())
    assert saved.nbytes == 3 * 8 * 4 and saved.shapes == [(3, 8)]  # the input, once; the weight left out
    _, with_weight = saved_activation_bytes(lambda: lin(x))
    assert with_weight.nbytes == (3 * 8 + 4 * 8) * 4


def test_an_elementwise_chain_saves_what_its_ops_need():
    x = torch.randn(5, 6, requires_grad=True)
    _, saved = saved_activation_bytes(lambda: torch.nn.functional.gelu(x).exp())
    assert saved.nbytes == 2 * 5 * 6 * 4  # gelu saves its input, exp its output


def test_not_callable_raises():
    with pytest.raises(ValueError, match="callable"):
        saved_activation_bytes(3)
