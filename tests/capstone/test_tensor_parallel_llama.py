"""Tests of utils.capstone.tensor_parallel_llama: the sharded block equals part 3's block, forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from utils.attention.llama import Block, LlamaConfig
from utils.capstone.mesh import Mesh, new_groups
from utils.capstone.tensor_parallel_llama import TensorParallelBlock
from utils.parallel.frontier.context_parallel import positions, shard_sequence, unshard_sequence
from utils.dist import launch
from utils.parallel.model.sequence_parallel import all_reduce_replicated_grads, split_sequence
from utils.parallel.model.tensor_parallel import shard

CONFIG = LlamaConfig(dim=64, n_heads=4, n_kv_heads=2, ffn_hidden=96)
SHARD_DIM = {"wq": ("attn.wq", 0), "wk": ("attn.wk", 0), "wv": ("attn.wv", 0), "wo": ("attn.wo", 1),
             "w1": ("w1", 0), "w3": ("w3", 0), "w2": ("w2", 1)}


def _reference(dtype):
    torch.manual_seed(0)
    block = Block(CONFIG).to(dtype)
    with torch.no_grad():  # norm weights away from 1, so a wrong gradient of them shows
        block.attn_norm.uniform_(0.5, 1.5)
        block.ffn_norm.uniform_(0.5, 1.5)
    x = torch.randn(2, 8, CONFIG.dim, dtype=dtype, requires_grad=True)
    w = torch.randn(2, 8, CONFIG.dim, dtype=dtype)
    return block, x, w


def _worker(rank, world_size, dtype):
    block, x, w = _reference(dtype)
    group = dist.new_group(list(range(world_size)))
    tp = TensorParallelBlock(block, group)
    x_local = split_sequence(x.detach(), 1, group).requires_grad_()
    y_local = tp(x_local)
    (y_local * split_sequence(w, 1, group)).sum().backward()
    all_reduce_replicated_grads(tp.replicated_parameters(), group)
    return {"y": y_local.detach(), "dx": x_local.grad, "grads": {n: p.grad for n, p in tp.named_parameters()}}


@pytest.mark.parametrize("dtype,tol", [(torch.float32, dict(rtol=1e-5, atol=1e-6)),
                                       (torch.float64, dict(rtol=1e-12, atol=1e-12))])
def test_two_ranks_equal_one_block_forward_and_backward(dtype, tol):
    block, x, w = _reference(dtype)
    y = block(x)
    (y * w).sum().backward()
    ranks = launch(_worker, 2, dtype, backend="gloo", timeout=120)
    torch.testing.assert_close(torch.cat([r["y"] for r in ranks], dim=1), y.detach(), **tol)
    torch.testing.assert_close(torch.cat([r["dx"] for r in ranks], dim=1), x.grad, **tol)
    for rank, r in enumerate(ranks):
        torch.testing.assert_close(r["grads"]["attn_norm"], block.attn_norm.grad, **tol)
        torch.testing.assert_close(r["grads"]["ffn_norm"], block.ffn_norm.grad, **tol)
        for name, (path, dim) in SHARD_DIM.items():
            full = block.get_submodule(path).weight.grad
            torch.testing.assert_close(r["grads"][name], full.chunk(2, dim=dim)[rank], **tol, msg=name)


def _cp_worker(rank, world_size, mesh):
    block, x, w = _reference(torch.float64)
    groups = new_groups(mesh, rank, [("tp",), ("cp",)])
    at = mesh.coords(rank)
    tp = TensorParallelBlock(block, groups[("tp",)], cp_group=groups[("cp",)])

    def local(t):  # this rank's tokens: its zig-zag share of the context-parallel ring, then its SP slice
        return shard_sequence(t, at["cp"], mesh.cp, "zigzag", dim=1).chunk(mesh.tp, dim=1)[at["tp"]]

    x_local = local(x.detach()).requires_grad_()
    y_local = tp(x_local, positions(x.shape[1], at["cp"], mesh.cp, "zigzag"))
    (y_local * local(w)).sum().backward()
    all_reduce_replicated_grads(tp.replicated_parameters(), groups[("tp",)])
    return {"y": y_local.detach(), "dx": x_local.grad, "grads": {n: p.grad for n, p in tp.named_parameters()}}


def test_tensor_and_context_parallel_block_equals_one_block():
    """2 x 2 ranks (tensor x context parallel, zig-zag ring attention) give the block's output and gradients in
    fp64 to 1e-12; each rank's weight gradients cover its ring's tokens only, so they sum over the ring."""
    mesh = Mesh(tp=2, cp=2)
    block, x, w = _reference(torch.float64)
    y = block(x)
    (y * w).sum().backward()
    ranks = launch(_cp_worker, 4, mesh, backend="gloo", timeout=120)
    tol = dict(rtol=1e-12, atol=1e-12)

    def whole(key):
        shares = [torch.cat([ranks[mesh.rank(tp=t, cp=c)][key] for t in range(2)], dim=1) for c in range(2)]
        return unshard_sequence(shares, "zigzag", dim=1)

    torch.testing.assert_close(whole("y"), y.detach(), **tol)
    torch.testing.assert_close(whole("dx"), x.grad, **tol)
    for t in range(2):
        grads = {n: sum(ranks[mesh.rank(tp=t, cp=c)]["grads"][n] for c in range(2)) for n in ranks[0]["grads"]}
        torch.testing.assert_close(grads["attn_norm"], block.attn_norm.grad, **tol)
        for name, (path, dim) in SHARD_DIM.items():
            full = block.get_submodule(path).weight.grad
            torch.testing.assert_close(grads[name], full.chunk(2, dim=dim)[t], **tol, msg=name)


def _bad(rank, world_size):
    group = dist.new_group(list(range(world_size)))
    TensorParallelBlock(Block(LlamaConfig(dim=64, n_heads=4, n_kv_heads=1)), group)


def test_kv_heads_that_do_not_split_are_refused():
    from utils.dist import WorkerError
    with pytest.raises(WorkerError, match="n_kv_heads divisible by 2"):
        launch(_bad, 2, backend="gloo", timeout=60)
