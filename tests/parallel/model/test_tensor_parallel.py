"""utils.parallel.model.tensor_parallel and sequence_parallel: on 2 and 4 gloo ranks, every output and every gradient
(weights, biases, input) equals the one-process model's, sliced where the rank holds a slice."""

import pytest
import torch
from torch import nn

from tests.parallel import value_error_messages
from utils.dist import launch
from utils.parallel.model import tensor_parallel as tp
from utils.parallel.model.sequence_parallel import all_reduce_replicated_grads, split_sequence

TOL = dict(rtol=1e-5, atol=1e-6)
B, S, H, HEADS = 2, 8, 16, 4


def _data(hidden=H):
    torch.manual_seed(1)
    return torch.randn(B, S, hidden), torch.randn(B, S, hidden)  # input, upstream gradient


def _run(model, x, upstream):
    """Output and input gradient of ``model`` for loss = sum(model(x) * upstream)."""
    x = x.clone().requires_grad_(True)
    y = model(x)
    (y * upstream).sum().backward()
    return y.detach(), x.grad


def _chunk(tensor, dim, rank, t):
    return tensor.chunk(t, dim=dim)[rank]


def _operators(rank, t):
    """f and g: the sum appears exactly where the paper puts it."""
    x = torch.full((3,), float(rank + 1), requires_grad=True)
    total = t * (t + 1) / 2
    y = tp.f(x)
    torch.testing.assert_close(y.detach(), x.detach())  # f: identity forward
    (y * (rank + 1)).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), total))  # f: all-reduce backward
    x.grad = None
    z = tp.g(x)
    torch.testing.assert_close(z.detach(), torch.full((3,), total))  # g: all-reduce forward
    (z * (rank + 1)).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), float(rank + 1)))  # g: identity backward
    return True


def _row(rank, t):
    torch.manual_seed(0)
    lin = nn.Linear(2 * H, H)
    x, up = torch.randn(B, S, 2 * H), torch.randn(B, S, H)
    y_ref, gx_ref = _run(lin, x, up)
    row = tp.row_parallel(lin)
    y, gx = _run(row, _chunk(x, -1, rank, t).contiguous(), up)
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(gx, _chunk(gx_ref, -1, rank, t), **TOL)
    torch.testing.assert_close(row.weight.grad, _chunk(lin.weight.grad, 1, rank, t), **TOL)
    torch.testing.assert_close(row.bias.grad, lin.bias.grad, **TOL)
    return True


def _block(rank, t, kind, sequence_parallel):
    """An MLP or attention block behind a LayerNorm; with sequence parallelism the LayerNorm sees 1/t of the tokens."""
    torch.manual_seed(0)
    norm = nn.LayerNorm(H)
    inner = tp.MLP(H) if kind == "mlp" else tp.SelfAttention(H, HEADS)
    with torch.no_grad():  # non-trivial LayerNorm parameters, so their gradients are tested for real
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    x, up = _data()
    y_ref, gx_ref = _run(nn.Sequential(norm, inner), x, up)
    wrap = tp.TensorParallelMLP if kind == "mlp" else tp.TensorParallelSelfAttention
    tp_norm = nn.LayerNorm(H)
    tp_norm.load_state_dict(norm.state_dict())
    tp_inner = wrap(inner, sequence_parallel=sequence_parallel)
    model = nn.Sequential(tp_norm, tp_inner)
    if sequence_parallel:
        y, gx = _run(model, split_sequence(x, 1), split_sequence(up, 1))
        all_reduce_replicated_grads([*tp_norm.parameters(), tp_inner.fc2.bias if kind == "mlp" else tp_inner.out.bias])
        torch.testing.assert_close(y, _chunk(y_ref, 1, rank, t), **TOL)
        torch.testing.assert_close(gx, _chunk(gx_ref, 1, rank, t), **TOL)
    else:
        y, gx = _run(model, x, up)
        torch.testing.assert_close(y, y_ref, **TOL)
        torch.testing.assert_close(gx, gx_ref, **TOL)
    torch.testing.assert_close(tp_norm.weight.grad, norm.weight.grad, **TOL)
    torch.testing.assert_close(tp_norm.bias.grad, norm.bias.grad, **TOL)
    if kind == "mlp":
        pairs = [(tp_inner.fc1, inner.fc1, 0), (tp_inner.fc2, inner.fc2, 1)]
    else:
        pairs = [(getattr(tp_inner, n), getattr(inner, n), 0) for n in "qkv"] + [(tp_inner.out, inner.out, 1)]
    for shard, full, dim in pairs:
        torch.testing.assert_close(shard.weight.grad, _chunk(full.weight.grad, dim, rank, t), **TOL)
        bias = _chunk(full.bias.grad, 0, rank, t) if dim == 0 else full.bias.grad
        torch.testing.assert_close(shard.bias.grad, bias, **TOL)
    return True


def _all(rank, t):
    results = [_operators(rank, t), _row(rank, t)]
    torch.manual_seed(0)
    lin = nn.Linear(H, 2 * H)
    x, up = torch.randn(B, S, H), torch.randn(B, S, 2 * H)
    y_ref, gx_ref = _run(lin, x, up)
    col = tp.column_parallel(lin)
    y, gx = _run(col, x, _chunk(up, -1, rank, t).contiguous())
    torch.testing.assert_close(y, _chunk(y_ref, -1, rank, t), **TOL)
    torch.testing.assert_close(gx, gx_ref, **TOL)  # f summed the ranks' partial input gradients
    torch.testing.assert_close(col.weight.grad, _chunk(lin.weight.grad, 0, rank, t), **TOL)
    torch.testing.assert_close(col.bias.grad, _chunk(lin.bias.grad, 0, rank, t), **TOL)
    for kind in ("mlp", "attention"):
        for sp in (False, True):
            results.append(_block(rank, t, kind, sp))
    return results


@pytest.mark.parametrize("world_size", [2, 4])
def test_tensor_parallel_layers_equal_the_full_model(world_size):
    out = launch(_all, world_size, timeout=120)
    assert all(all(r) for r in out) and len(out[0]) == 6


def _errors(rank, t):
    attempts = [
        lambda: tp.column_parallel(nn.Linear(8, 6)),  # 6 output features over 4 ranks
        lambda: tp.row_parallel(nn.Linear(6, 8)),  # 6 input features over 4 ranks
        lambda: tp.TensorParallelSelfAttention(tp.SelfAttention(12, 6)),  # 6 heads over 4 ranks
        lambda: split_sequence(torch.randn(1, 6, 8), 1),  # 6 tokens over 4 ranks
        lambda: tp.column_parallel(nn.Conv1d(4, 4, 1)),
    ]
    return value_error_messages(attempts)


def test_sizes_that_do_not_divide_raise_value_error():
    messages = launch(_errors, 4, timeout=60)[0]
    assert "out_features divisible by 4" in messages[0]
    assert "in_features divisible by 4" in messages[1]
    assert "n_heads divisible by 4" in messages[2]
    assert "sequence length divisible" in messages[3]
    assert "torch.nn.Linear" in messages[4]


def _two_groups(rank, world_size):
    """Four ranks as two tensor-parallel groups of two (as beside data parallelism): each group alone equals the
    full model, and no collective leaks into the other group."""
    groups = [torch.distributed.new_group([0, 1]), torch.distributed.new_group([2, 3])]
    group, local = groups[rank // 2], rank % 2
    torch.manual_seed(0)
    mlp = tp.MLP(H)
    torch.manual_seed(1 + rank // 2)  # each group gets its own data, as data-parallel replicas would
    x, up = torch.randn(B, S, H), torch.randn(B, S, H)
    y_ref, gx_ref = _run(mlp, x, up)
    for sp in (False, True):
        model = tp.TensorParallelMLP(mlp, group=group, sequence_parallel=sp)
        if sp:
            y, gx = _run(model, split_sequence(x, 1, group), split_sequence(up, 1, group))
            all_reduce_replicated_grads([model.fc2.bias], group)
            torch.testing.assert_close(y, _chunk(y_ref, 1, local, 2), **TOL)
            torch.testing.assert_close(gx, _chunk(gx_ref, 1, local, 2), **TOL)
        else:
            y, gx = _run(model, x, up)
            torch.testing.assert_close(y, y_ref, **TOL)
            torch.testing.assert_close(gx, gx_ref, **TOL)
        torch.testing.assert_close(model.fc1.weight.grad, _chunk(mlp.fc1.weight.grad, 0, local, 2), **TOL)
        torch.testing.assert_close(model.fc2.weight.grad, _chunk(mlp.fc2.weight.grad, 1, local, 2), **TOL)
        torch.testing.assert_close(model.fc2.bias.grad, mlp.fc2.bias.grad, **TOL)
    return True


def test_tensor_parallel_groups_inside_a_larger_world():
    assert all(launch(_two_groups, 4, timeout=60))
