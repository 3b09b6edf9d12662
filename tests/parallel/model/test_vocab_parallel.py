"""utils.parallel.model.vocab_parallel on 2 and 4 gloo ranks: the vocabulary-parallel embedding and cross-entropy give
one process's loss and gradients (tied and untied output layer), agree with PyTorch's loss_parallel, and
communicate b*s scalars three times instead of the logits."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, loss_parallel, parallelize_module

from utils.dist import launch
from utils.parallel.model import tensor_parallel as tp
from utils.parallel.model.vocab_parallel import (VocabParallelEmbedding, cross_entropy_communication_elements,
                                           vocab_parallel_cross_entropy, vocab_range)

TOL = dict(rtol=1e-5, atol=1e-6)
V, H, B, S = 32, 8, 2, 6


class TinyLM(nn.Module):
    """Embedding, a tanh, an output layer (tied to the embedding or not)."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(V, H), nn.Linear(H, V, bias=False)
        if tied:
            self.head.weight = self.emb.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.emb(tokens)))


def _data():
    torch.manual_seed(0)
    return torch.randint(0, V, (B, S)), torch.randint(0, V, (B, S))


def _ours(rank, t, tied):
    torch.manual_seed(0)
    full = TinyLM(tied)
    tokens, target = _data()
    ref = F.cross_entropy(full(tokens).flatten(0, 1), target.flatten())
    ref.backward()
    emb = VocabParallelEmbedding(full.emb)
    head_weight = emb.weight if tied else nn.Parameter(tp.shard(full.head.weight, 0))
    with CommDebugMode() as fwd:
        x = torch.tanh(emb(tokens))
        local_logits = F.linear(tp.f(x), head_weight)  # column-parallel over the vocabulary
        loss = vocab_parallel_cross_entropy(local_logits, target).mean()
    with CommDebugMode() as bwd:
        loss.backward()
    torch.testing.assert_close(loss, ref, **TOL)
    torch.testing.assert_close(emb.weight.grad, full.emb.weight.grad.chunk(t, 0)[rank], **TOL)
    if not tied:
        torch.testing.assert_close(head_weight.grad, full.head.weight.grad.chunk(t, 0)[rank], **TOL)
    names = lambda mode: {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}  # noqa: E731
    return names(fwd), names(bwd), local_logits.shape


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("tied", [False, True])
def test_vocab_parallel_loss_and_gradients_equal_one_process(world_size, tied):
    for fwd, bwd, shape in launch(_ours, world_size, tied, timeout=60):
        assert shape == (B, S, V // world_size)
        assert fwd == {"allreduce_": 4}  # the embedding's g, then max, target logit, sum of exponentials
        assert bwd == {"allreduce_": 1}  # f before the output layer; the loss's backward is local


def _against_loss_parallel(rank, t):
    """PyTorch's engine: RowwiseParallel embedding, ColwiseParallel head with sharded logits, loss_parallel."""
    torch.manual_seed(0)
    full = TinyLM(tied=False)
    tokens, target = _data()
    ours_emb = VocabParallelEmbedding(full.emb)
    ours_head = nn.Parameter(tp.shard(full.head.weight, 0))
    ours = vocab_parallel_cross_entropy(F.linear(tp.f(torch.tanh(ours_emb(tokens))), ours_head), target).mean()
    ours.backward()
    torch.manual_seed(0)
    model = parallelize_module(TinyLM(tied=False), init_device_mesh("cpu", (t,)), {
        "emb": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
    with loss_parallel():
        theirs = F.cross_entropy(model(tokens).flatten(0, 1), target.flatten())
        theirs.backward()
    torch.testing.assert_close(ours, theirs.full_tensor(), **TOL)
    for mine, theirs_grad in ((ours_emb.weight.grad, model.emb.weight.grad), (ours_head.grad, model.head.weight.grad)):
        # the embedding's gradient comes back Replicate() on torch 2.13, whatever its weight's Shard(0): compare slices
        torch.testing.assert_close(mine, theirs_grad.full_tensor().chunk(t, 0)[rank], **TOL)
    return True


def test_vocab_parallel_equals_pytorch_loss_parallel():
    assert all(launch(_against_loss_parallel, 2, timeout=60))


def test_vocab_range_and_communication_counts():
    assert [vocab_range(10, r, 2) for r in range(2)] == [(0, 5), (5, 10)]
    counts = cross_entropy_communication_elements(1, 4096, 128256)  # Llama 3's vocabulary (arXiv:2407.21783)
    assert counts == {"gather": 4096 * 128256, "vocab_parallel": 3 * 4096}
    with pytest.raises(ValueError, match="pad it"):
        vocab_range(10, 0, 4)
    with pytest.raises(ValueError, match="rank"):
        vocab_range(8, 4, 4)
    with pytest.raises(ValueError, match="vocab"):
        cross_entropy_communication_elements(1, 8, 0)


def _shape_error(rank, t):
    try:
        vocab_parallel_cross_entropy(torch.randn(B, S, V // t), torch.zeros(B, S + 1, dtype=torch.long))
    except ValueError as exc:
        return str(exc)
    return None


def test_mismatched_target_raises():
    assert "need a target of shape" in launch(_shape_error, 2, timeout=60)[0]


def _boundary_targets(rank, t):
    logits = torch.tensor([[0.0, 0.0, float(torch.tensor(2.0).log()), 0.0]] * 2).unsqueeze(0)  # 1 x 2 tokens x V = 4
    local = logits.chunk(t, -1)[rank].clone().requires_grad_(True)
    loss = vocab_parallel_cross_entropy(local, torch.tensor([[1, 2]]))  # the last id of rank 0, the first of rank 1
    loss.sum().backward()
    emb = nn.Embedding(4, 1)
    with torch.no_grad():
        emb.weight.copy_(torch.tensor([[10.0], [11.0], [12.0], [13.0]]))
    looked_up = VocabParallelEmbedding(emb)(torch.tensor([0, 1, 2, 3]))
    return loss.detach(), local.grad, looked_up.flatten()


def test_vocab_parallel_tokens_on_the_shard_boundary():
    # V = 4 over 2 ranks: rank 0 holds ids 0-1, rank 1 ids 2-3. Logits (0, 0, ln 2, 0): the softmax is
    # (1, 1, 2, 1) / 5, so target 1 costs ln 5 and target 2 costs ln 5 - ln 2; the gradient is the
    # softmax minus the target's one-hot, each rank its own half.
    out = launch(_boundary_targets, 2, timeout=60)
    softmax = torch.tensor([0.2, 0.2, 0.4, 0.2])
    grad = torch.stack([softmax - torch.tensor([0.0, 1.0, 0.0, 0.0]), softmax - torch.tensor([0.0, 0.0, 1.0, 0.0])])
    for rank, (loss, local_grad, looked_up) in enumerate(out):
        torch.testing.assert_close(loss, torch.tensor([[5.0, 2.5]]).log())
        torch.testing.assert_close(local_grad, grad.chunk(2, -1)[rank].unsqueeze(0))
        torch.testing.assert_close(looked_up, torch.tensor([10.0, 11.0, 12.0, 13.0]))
