"""utils.parallel.model.paper_layer: the layer Korthikanti et al. count. On one process it saves sbh(34 + 5as/h) bytes;
tensor + sequence parallel on 2 and 4 gloo ranks, sbh(34/t + 5as/(ht)) per rank (Table 2, from
utils.parallel.memory), plus LayerNorm's statistics; without dropout it equals one process."""

import pytest
import torch
from torch.distributed.tensor.debug import CommDebugMode

from utils.dist import launch
from utils.parallel.model.dropout_rng import model_parallel_manual_seed
from utils.parallel.memory import activation_bytes_per_layer
from utils.parallel.model.paper_layer import PaperLayer, SequenceParallelPaperLayer
from utils.parallel.model.saved_activations import saved_activation_bytes
from utils.parallel.model.sequence_parallel import all_reduce_replicated_grads, split_sequence

S, B, H, A = 16, 2, 32, 4


def _activation_and_stats_bytes(saved):
    """(activations, LayerNorm statistics): LayerNorm's mean and 1/std are the saved tensors of shape [s, b, 1]."""
    stats = sum(n for shape, n in zip(saved.shapes, saved.sizes) if shape[-1] == 1)
    return saved.nbytes - stats, stats


def test_one_process_saves_34_sbh_plus_5_as2b():
    torch.manual_seed(0)
    layer = PaperLayer(H, A).to(torch.bfloat16)
    x = torch.randn(S, B, H, dtype=torch.bfloat16, requires_grad=True)
    _, saved = saved_activation_bytes(lambda: layer(x), exclude=layer.parameters())
    act, stats = _activation_and_stats_bytes(saved)
    assert act == activation_bytes_per_layer(S, B, H, A)
    assert stats // (2 * 2 * S * B) in (2, 4)  # two LayerNorms' mean and 1/std, s b elements (bf16 on CPU, fp32 on CUDA)


def _sp(rank, t):
    tracker = model_parallel_manual_seed(1234, rank)
    torch.manual_seed(0)
    layer = PaperLayer(H, A).to(torch.bfloat16)
    x = split_sequence(torch.randn(S, B, H, dtype=torch.bfloat16), 0).requires_grad_(True)
    sp = SequenceParallelPaperLayer(layer, tracker=tracker)
    with CommDebugMode() as fwd:
        y, saved = saved_activation_bytes(lambda: sp(x), exclude=sp.parameters())
    with CommDebugMode() as bwd:
        y.float().pow(2).sum().backward()
    names = lambda mode: {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}  # noqa: E731
    return _activation_and_stats_bytes(saved), names(fwd), names(bwd)


@pytest.mark.parametrize("world_size", [2, 4])
def test_sequence_parallel_layer_saves_34_over_t(world_size):
    for (act, stats), fwd, bwd in launch(_sp, world_size, timeout=60):
        assert act == activation_bytes_per_layer(S, B, H, A, tp=world_size, sequence_parallel=True)
        assert stats // (2 * 2 * (S // world_size) * B) in (2, 4)
        assert fwd == {"_allgather_base_": 2, "_reduce_scatter_base_": 2}
        assert bwd == {"_allgather_base_": 4, "_reduce_scatter_base_": 2}  # 10 phases against tensor parallelism's 8


def _equal(rank, t):
    torch.manual_seed(0)
    layer = PaperLayer(H, A, p_drop=0.0)
    x = torch.randn(S, B, H)
    x_full = x.clone().requires_grad_(True)
    layer(x_full).pow(2).sum().backward()
    sp = SequenceParallelPaperLayer(layer)
    x_local = split_sequence(x, 0).requires_grad_(True)
    y = sp(x_local)
    y.pow(2).sum().backward()
    all_reduce_replicated_grads([*sp.ln1.parameters(), *sp.ln2.parameters(), sp.proj_b, sp.fc2_b])
    tol = dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(y, layer(x).chunk(t, 0)[rank], **tol)
    torch.testing.assert_close(x_local.grad, x_full.grad.chunk(t, 0)[rank], **tol)
    for mine, full, dim in ((sp.q_w, layer.q.weight, 0), (sp.fc1_b, layer.fc1.bias, 0), (sp.proj_w, layer.proj.weight, 1),
                            (sp.fc2_w, layer.fc2.weight, 1), (sp.fc2_b, layer.fc2.bias, None),
                            (sp.ln1.weight, layer.ln1.weight, None)):
        torch.testing.assert_close(mine.grad, full.grad if dim is None else full.grad.chunk(t, dim)[rank], **tol)
    return True


@pytest.mark.parametrize("world_size", [2, 4])
def test_without_dropout_the_layer_equals_one_process(world_size):
    assert all(launch(_equal, world_size, timeout=60))


def test_bad_layers_raise():
    with pytest.raises(ValueError, match="multiple of n_heads"):
        PaperLayer(30, 4)
    with pytest.raises(ValueError, match="p_drop"):
        PaperLayer(32, 4, p_drop=1.0)
