"""utils.parallel.model.sequence_parallel: the linear that saves only the sequence shard (Korthikanti et al. section 4.2.2),
on 2 and 4 gloo ranks. What it saves for backward (the shard's bytes, not the gathered input's), how many
all-gathers and reduce-scatters it runs each way, and that its outputs and gradients equal one process."""

import pytest
import torch
from torch import nn
from torch.distributed.tensor.debug import CommDebugMode

from tests.parallel import value_error_messages
from utils.dist import launch
from utils.parallel.model import tensor_parallel as tp
from utils.parallel.model.saved_activations import saved_activation_bytes
from utils.parallel.model.sequence_parallel import all_gather_linears, gather_from_sequence_parallel, split_sequence

TOL = dict(rtol=1e-5, atol=1e-6)
B, S, H = 2, 8, 16
FP32 = 4  # bytes per element


def _names(mode):
    return {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}


def _linears(rank, t):
    """Two column-parallel linears (one without bias) behind one all-gather: outputs and gradients equal one process."""
    torch.manual_seed(0)
    first, second = nn.Linear(H, 2 * H), nn.Linear(H, H, bias=False)
    x, up1, up2 = torch.randn(B, S, H), torch.randn(B, S, 2 * H), torch.randn(B, S, H)
    xf = x.clone().requires_grad_(True)
    ((first(xf) * up1).sum() + (second(xf) * up2).sum()).backward()
    local = split_sequence(x, 1).requires_grad_(True)
    w1, b1, w2 = (tp.shard(p, 0).requires_grad_(True) for p in (first.weight, first.bias, second.weight))
    mine = lambda full: full.chunk(t, -1)[rank]  # noqa: E731 - this rank's output features
    with CommDebugMode() as fwd:
        y1, y2 = all_gather_linears(local, [(w1, b1), (w2, None)], seq_dim=1)
    with CommDebugMode() as bwd:
        ((y1 * mine(up1)).sum() + (y2 * mine(up2)).sum()).backward()
    torch.testing.assert_close(y1, mine(first(x)), **TOL)
    torch.testing.assert_close(y2, mine(second(x)), **TOL)
    torch.testing.assert_close(local.grad, xf.grad.chunk(t, 1)[rank], **TOL)
    for shard, full in ((w1, first.weight), (b1, first.bias), (w2, second.weight)):
        torch.testing.assert_close(shard.grad, full.grad.chunk(t, 0)[rank], **TOL)
    return _names(fwd), _names(bwd)


@pytest.mark.parametrize("world_size", [2, 4])
def test_all_gather_linears_equal_one_process_with_one_gather_forward_and_gather_plus_scatter_backward(world_size):
    for fwd, bwd in launch(_linears, world_size, timeout=60):
        assert fwd == {"_allgather_base_": 1}
        assert bwd == {"_allgather_base_": 1, "_reduce_scatter_base_": 1}


def _mlp_saved(rank, t):
    """The sequence-parallel MLP's saved bytes and collectives, against the same MLP behind a plain all-gather."""
    torch.manual_seed(0)
    mlp = tp.MLP(H)
    x = split_sequence(torch.randn(B, S, H), 1).requires_grad_(True)
    sp = tp.TensorParallelMLP(mlp, sequence_parallel=True)
    with CommDebugMode() as fwd:
        y, saved = saved_activation_bytes(lambda: sp(x), exclude=sp.parameters())
    with CommDebugMode() as bwd:
        y.pow(2).sum().backward()
    naive = tp.TensorParallelMLP(mlp, sequence_parallel=True)
    gathered = lambda: naive.fc2(torch.nn.functional.gelu(  # noqa: E731 - the all-gather, then an ordinary linear
        torch.nn.functional.linear(gather_from_sequence_parallel(x, 1), naive.fc1.weight, naive.fc1.bias)))
    y_naive, saved_naive = saved_activation_bytes(gathered, exclude=naive.parameters())
    torch.testing.assert_close(y, y_naive, **TOL)
    return saved, saved_naive, _names(fwd), _names(bwd)


@pytest.mark.parametrize("world_size", [2, 4])
def test_sequence_parallel_mlp_saves_the_shard_and_gathers_it_again_in_backward(world_size):
    t = world_size
    bsh = B * S * H
    for saved, naive, fwd, bwd in launch(_mlp_saved, world_size, timeout=60):
        # fc1's input: the shard, b (s/t) h; the GeLU's input and fc2's input: b s (4h/t) each.
        assert saved.nbytes == FP32 * (bsh // t + 2 * 4 * bsh // t)
        assert saved.shapes[0] == (B, S // t, H)
        # behind a plain all-gather, fc1 saves the gathered b s h instead.
        assert naive.nbytes == FP32 * (bsh + 2 * 4 * bsh // t)
        assert fwd == {"_allgather_base_": 1, "_reduce_scatter_base_": 1}
        # backward: fc2's reduce-scatter becomes an all-gather, fc1 all-gathers its input again and
        # reduce-scatters the input gradient: one all-gather more than the forward's mirror image.
        assert bwd == {"_allgather_base_": 2, "_reduce_scatter_base_": 1}


def _attention_counts(rank, t):
    torch.manual_seed(0)
    attn = tp.SelfAttention(H, 4)
    x = split_sequence(torch.randn(B, S, H), 1).requires_grad_(True)
    sp = tp.TensorParallelSelfAttention(attn, sequence_parallel=True)
    with CommDebugMode() as fwd:
        y, saved = saved_activation_bytes(lambda: sp(x), exclude=sp.parameters())
    with CommDebugMode() as bwd:
        y.sum().backward()
    return _names(fwd), _names(bwd), saved.shapes


def test_sequence_parallel_attention_shares_one_gather_between_q_k_v_and_saves_only_the_shard():
    for fwd, bwd, shapes in launch(_attention_counts, 2, timeout=60):
        assert fwd == {"_allgather_base_": 1, "_reduce_scatter_base_": 1}
        assert bwd == {"_allgather_base_": 2, "_reduce_scatter_base_": 1}
        assert (B, S // 2, H) in shapes and (B, S, H) not in shapes


def _errors(rank, t):
    return value_error_messages([
        lambda: all_gather_linears(torch.randn(B, S // t, H), []),
        lambda: all_gather_linears(torch.randn(B, S // t, H), [(torch.randn(H, H), None)], seq_dim=3)])


def test_bad_arguments_raise_value_error():
    messages = launch(_errors, 2, timeout=60)[0]
    assert "at least one (weight, bias) pair" in messages[0]
    assert "seq_dim=3 is out of range" in messages[1]


def _gather_by_hand(rank, t):
    local = torch.tensor([[1.0, 2.0], [3.0, 4.0]])[rank].view(1, 2, 1).requires_grad_(True)
    full = gather_from_sequence_parallel(local, 1)
    upstream = torch.tensor([1.0, 10.0, 100.0, 1000.0]).view(1, 4, 1) * (rank + 1)
    (full * upstream).sum().backward()
    return full.detach().flatten().tolist(), local.grad.flatten().tolist()


def test_gather_from_sequence_parallel_sums_the_ranks_gradients_in_backward():
    # Each rank's loss reads the whole gathered sequence, so the gradient of rank r's slice is the sum of
    # every rank's upstream gradient over that slice: rank 0 gets 1 + 2 and 10 + 20, rank 1 300 and 3000.
    # Splitting the upstream gradient without summing would give rank 0 [1, 10] and rank 1 [200, 2000].
    out = launch(_gather_by_hand, 2, timeout=60)
    assert [full for full, _ in out] == [[1.0, 2.0, 3.0, 4.0]] * 2
    assert [grad for _, grad in out] == [[3.0, 30.0], [300.0, 3000.0]]
