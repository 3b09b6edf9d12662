import math

import pytest
import torch

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.serving.runtime.batched_attention import DecodeBatch, paged_decode_reference, triton_can_run
from utils.serving.runtime.engine import Engine
from utils.serving.runtime.paged_forward import KVBlocks, Segment, forward_segments

from tests.serving.runtime.test_engine import workload


def tiny(dtype=torch.float64, head_dim=8, seed=0):
    torch.manual_seed(seed)
    return TinyLlama(LlamaConfig(vocab=64, dim=4 * head_dim, n_layers=2, n_heads=4, n_kv_heads=2)).to(dtype).eval()


def mixed_steps(block_size):
    """Two steps over scattered blocks: prompts prefilled (one chunked), then decodes beside a prefill chunk."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (9, 5, 12, 3)]
    tables = [(7, 2, 11, 4), (0, 9), (3, 14, 6, 1), (12, 5)]
    first = [Segment(tuple(prompts[0]), 0, tables[0]), Segment(tuple(prompts[1]), 0, tables[1]),
             Segment(tuple(prompts[2][:6]), 0, tables[2]), Segment(tuple(prompts[3]), 0, tables[3])]
    second = [Segment((5,), 9, tables[0]), Segment(tuple(prompts[2][6:]), 6, tables[2]),
              Segment((17,), 5, tables[1]), Segment((33,), 3, tables[3])]
    third = [Segment((8,), 10, tables[0]), Segment((1,), 6, tables[1]), Segment((2,), 4, tables[3])]
    return [first, second, third]


def run_steps(model, mode, block_size=4, dtype=None):
    kv = KVBlocks(model, num_blocks=16, block_size=block_size, dtype=dtype)
    return [forward_segments(model, kv, step, mode) for step in mixed_steps(block_size)], kv


@pytest.mark.parametrize("mode", ["batched", "torch"])
def test_batched_decodes_equal_the_loop_in_float64(mode):
    model = tiny()
    want, kv_loop = run_steps(model, "loop")
    got, kv = run_steps(model, mode)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=0)
    assert torch.equal(kv.k, kv_loop.k) and torch.equal(kv.v, kv_loop.v)  # the same keys in the same slots


def test_reference_equals_softmax_over_each_request_contiguous_keys():
    torch.manual_seed(0)
    n_blocks, block, n_kv, d, heads = 10, 4, 2, 8, 6
    k_blocks, v_blocks = torch.randn(2, n_blocks, block, n_kv, d, dtype=torch.float64)
    tables, lengths = [[3, 7, 1], [9], [0, 4]], [11, 2, 5]
    batch = DecodeBatch(tables, lengths, block, "cpu", "torch")
    q = torch.randn(3, heads, d, dtype=torch.float64)
    got = paged_decode_reference(q, k_blocks, v_blocks, batch.tables, batch.lengths)
    for r, (table, n) in enumerate(zip(tables, lengths)):
        keys = torch.cat([k_blocks[b] for b in table])[:n]          # (n, n_kv, d)
        values = torch.cat([v_blocks[b] for b in table])[:n]
        for h in range(heads):
            g = h // (heads // n_kv)
            p = torch.softmax(keys[:, g] @ q[r, h] / math.sqrt(d), 0)
            torch.testing.assert_close(got[r, h], p @ values[:, g], atol=1e-13, rtol=0)
    assert batch.tables.dtype == torch.int32 and batch.tables.shape == (3, 3) and batch.max_len == 11


def test_triton_split_kv_backend_matches_the_loop():
    """The kernel the GPU runs, here under Triton's interpreter, in fp32 (head size 16, 4-token blocks)."""
    model = tiny(torch.float32, head_dim=16)
    want, _ = run_steps(model, "loop")
    got, _ = run_steps(model, "triton")
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_batched_resolves_to_torch_without_a_gpu_cache():
    k = torch.zeros(4, 4, 2, 16)
    assert not triton_can_run(k, torch.float32)
    assert DecodeBatch([[0]], [1], 4, "cpu").resolve(k, torch.float32) == "torch"
    assert DecodeBatch([[0]], [1], 4, "cpu", "triton").resolve(k, torch.float32) == "triton"


def test_bad_input():
    with pytest.raises(ValueError, match="backend"):
        DecodeBatch([[0]], [1], 4, "cpu", "loop")
    with pytest.raises(ValueError, match="covered"):
        DecodeBatch([[0]], [5], 4, "cpu")
    with pytest.raises(ValueError, match=">= 1"):
        DecodeBatch([[0]], [0], 4, "cpu")
    with pytest.raises(ValueError, match="one block table per length"):
        DecodeBatch([[0], [1]], [1], 4, "cpu")
    with pytest.raises(ValueError, match="multiple"):
        paged_decode_reference(torch.zeros(1, 3, 8), torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8),
                               torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
    model = tiny()
    kv = KVBlocks(model, 4, 4)
    with pytest.raises(ValueError, match="decode_attention"):
        forward_segments(model, kv, [Segment((1,), 0, (0,))], "fast")
    with pytest.raises(ValueError, match="decode_attention"):
        Engine(model, 4, 4, 8, decode_attention="fast")


@pytest.mark.parametrize("kwargs", [dict(num_blocks=9, block_size=4, max_num_batched_tokens=16),
                                    dict(num_blocks=12, block_size=4, max_num_batched_tokens=8, prefix_caching=True),
                                    dict(num_blocks=64, block_size=4, max_num_batched_tokens=5)])
def test_engine_with_batched_decodes_equals_greedy_generate(kwargs):
    """test_engine's workload with preemption, prefix hits and chunking, decodes batched."""
    model = tiny()
    requests = workload(1)
    engine = Engine(model, **kwargs, decode_attention="batched")
    ids = [engine.add_request(p, n) for p, n in requests]
    out = engine.run()
    for i, (p, n) in zip(ids, requests):
        assert out[i] == model.generate(torch.tensor([p]), n)[0, len(p):].tolist()
    stats = engine.stats()
    assert max(sum(phase == "decode" for _, _, phase in r.chunks) for r in stats.schedule) >= 3
    if kwargs["num_blocks"] < 64:
        assert stats.preemptions > 0
    if kwargs.get("prefix_caching"):
        assert stats.prefix_hit_tokens >= 4


def test_auto_is_the_loop_on_a_cpu():
    assert Engine(tiny(), 4, 4, 8).decode_attention == "loop"  # nothing changes for CPU runs
