"""utils.parallel.frontier.context_parallel: ring attention on 2 and 4 gloo ranks equals SDPA on one process (outputs and
dq, dk, dv), causal or not, contiguous or zigzag; shard/unshard round-trips; the causal work per rank (zigzag
balanced, contiguous P times apart) and that the ring computes exactly that; grouped-query heads; subgroups; the
cost model against its step-by-step simulation; bad inputs raise ValueError."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.parallel import value_error_messages
from utils.dist import launch
from utils.parallel.frontier.context_parallel import (
    chunk_ids,
    min_local_seq_to_hide,
    positions,
    ring_attention,
    ring_attention_seconds,
    ring_attention_work,
    ring_step_costs,
    shard_sequence,
    unshard_sequence,
)

B, H, D = 2, 3, 8


def _qkv_grad(seq, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, seq, D, generator=g, dtype=dtype) for _ in range(4)]  # q, k, v, dO


def _ring(rank, world_size, seq, causal, layout, dtype):
    q, k, v, d_out = (shard_sequence(t, rank, world_size, layout) for t in _qkv_grad(seq, dtype))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = ring_attention(q, k, v, causal=causal, layout=layout)
    out.backward(d_out)
    return out.detach(), q.grad, k.grad, v.grad


def _sdpa(seq, causal, dtype):
    q, k, v, d_out = _qkv_grad(seq, dtype)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(d_out)
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [False, True])
def test_ring_attention_equals_sdpa_outputs_and_gradients_fp64(world_size, layout, causal):
    seq = 4 * world_size + 8 * world_size  # 12 tokens per rank: zigzag chunks of 6
    per_rank = launch(_ring, world_size, seq, causal, layout, torch.float64, timeout=90)
    expected = _sdpa(seq, causal, torch.float64)
    for name, i in (("out", 0), ("dq", 1), ("dk", 2), ("dv", 3)):
        got = unshard_sequence([r[i] for r in per_rank], layout)
        torch.testing.assert_close(got, expected[i], rtol=1e-10, atol=1e-12, msg=f"{name} differs from SDPA")


def test_ring_attention_fp32_on_two_ranks_within_fp32_tolerance():
    per_rank = launch(_ring, 2, 16, True, "zigzag", torch.float32, timeout=90)
    expected = _sdpa(16, True, torch.float32)
    for i in range(4):
        got = unshard_sequence([r[i] for r in per_rank], "zigzag")
        torch.testing.assert_close(got, expected[i], rtol=1e-5, atol=1e-6)


def _single(rank, world_size):
    # One forked rank gets launch's cpu_count // 1 threads, and an OpenMP pool inherited from a parent that
    # already ran threaded ops hangs (seen here after the SDPA tests); one thread avoids that pool.
    torch.set_num_threads(1)
    q, k, v, _ = _qkv_grad(6, torch.float64)
    return ring_attention(q, k, v, causal=True, layout="zigzag")


def test_one_rank_is_plain_attention():
    (out,) = launch(_single, 1, timeout=60)
    q, k, v, _ = _qkv_grad(6, torch.float64)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True), rtol=1e-12, atol=1e-12)


def _bad_calls(rank, world_size):
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64)  # 3 tokens per rank: 6 in all, not 4 zigzag chunks
    return value_error_messages([
        lambda: ring_attention(q, q, q, causal=True, layout="zigzag"),
        lambda: ring_attention(q, q, q, layout="striped"),
        lambda: ring_attention(q, q[:, :, :2], q[:, :, :2]),
        lambda: ring_attention(q[0], q[0], q[0]),
        lambda: ring_attention(q.repeat(1, 2, 1, 1)[:, :3], q, q)])  # 2 KV heads do not divide 3 query heads


def test_ring_attention_rejects_bad_inputs_on_every_rank():
    for errors in launch(_bad_calls, 2, timeout=60):
        assert all(e is not None for e in errors), errors


def test_ring_attention_needs_a_process_group():
    q = torch.randn(1, 1, 2, 2)
    with pytest.raises(ValueError, match="process group"):
        ring_attention(q, q, q)


def test_zigzag_chunks_and_positions_follow_llama3():
    # Llama 3 section 3.3.2: rank i of CP takes chunks i and 2*CP-1-i of 2*CP.
    assert [chunk_ids(r, 4, "zigzag") for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert positions(8, 1, 2, "zigzag").tolist() == [2, 3, 4, 5]
    assert positions(8, 0, 2, "zigzag").tolist() == [0, 1, 6, 7]
    assert positions(8, 1, 2, "contiguous").tolist() == [4, 5, 6, 7]


@settings(max_examples=40, deadline=None)
@given(world_size=st.integers(1, 6), chunk=st.integers(1, 4), layout=st.sampled_from(["contiguous", "zigzag"]),
       dim=st.integers(0, 2))
def test_shard_then_unshard_round_trips_and_shards_partition_the_positions(world_size, chunk, layout, dim):
    seq = chunk * world_size * (2 if layout == "zigzag" else 1)
    shape = [2, 3, 2]
    shape[dim] = seq
    x = torch.arange(math.prod(shape)).reshape(shape)
    shards = [shard_sequence(x, r, world_size, layout, dim=dim) for r in range(world_size)]
    assert all(s.shape[dim] == seq // world_size for s in shards)
    assert torch.equal(unshard_sequence(shards, layout, dim=dim), x)
    every = torch.cat([positions(seq, r, world_size, layout) for r in range(world_size)])
    assert sorted(every.tolist()) == list(range(seq))


@pytest.mark.parametrize("seq, world_size, layout", [(6, 4, "contiguous"), (12, 4, "zigzag"), (6, 2, "zigzag")])
def test_shard_sequence_rejects_lengths_the_layout_cannot_split(seq, world_size, layout):
    with pytest.raises(ValueError, match="not divisible"):
        shard_sequence(torch.zeros(1, 1, seq, 2), 0, world_size, layout)


@pytest.mark.parametrize("call", [
    lambda: shard_sequence(torch.zeros(1, 1, 8, 2), 2, 2, "zigzag"),
    lambda: shard_sequence(torch.zeros(1, 1, 8, 2), 0, 2, "striped"),
    lambda: shard_sequence(torch.zeros(1, 1, 8, 2), 0, 2, "contiguous", dim=4),
    lambda: unshard_sequence([], "contiguous"),
    lambda: unshard_sequence([torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 3, 2)], "contiguous"),
    lambda: ring_attention_work(10, 3, "zigzag"),
    lambda: ring_step_costs(8, 6, 4, 64),
    lambda: min_local_seq_to_hide(8, 8, 1e15, 0.0),
    lambda: min_local_seq_to_hide(8, 8, 1e15, 1e11, compute_fraction=1.5),
    lambda: ring_attention_seconds(16, 2, 8, 8, 64, 1e15, 1e11, latency_s=-1.0),
    lambda: ring_attention_seconds(16, 2, 8, 8, 64, 1e15, 0.0),
])
def test_bad_inputs_raise_value_error(call):
    with pytest.raises(ValueError):
        call()


def _brute_force_work(seq, world_size, layout, causal):
    """Entries of each step's block that lie in the bounding box of its unmasked entries, from the full mask."""
    pos = [positions(seq, r, world_size, layout) for r in range(world_size)]
    work = []
    for r in range(world_size):
        row = []
        for t in range(world_size):
            k = pos[(r - t) % world_size]
            visible = (k[None, :] <= pos[r][:, None]) if causal else torch.ones(len(pos[r]), len(k), dtype=torch.bool)
            row.append(int(visible.any(1).sum()) * int(visible.any(0).sum()))
        work.append(row)
    return work


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_causal_work_zigzag_balanced_exactly_and_contiguous_p_times_apart(world_size):
    p, c = world_size, 3  # c tokens per zigzag chunk
    seq = 2 * p * c
    n = seq // p
    zig = ring_attention_work(seq, p, "zigzag")
    con = ring_attention_work(seq, p, "contiguous")
    assert zig == _brute_force_work(seq, p, "zigzag", True)
    assert con == _brute_force_work(seq, p, "contiguous", True)
    # zigzag: the own block in full, then half a block (2c x c or c x 2c) at every other step.
    assert [sum(w) for w in zig] == [(2 * p + 2) * c * c] * p
    # contiguous: rank r computes r + 1 full n x n blocks; the last rank P times the first.
    assert [sum(w) for w in con] == [(r + 1) * n * n for r in range(p)]
    assert max(map(sum, con)) / min(map(sum, con)) == p
    # the same total; the ring's time, the slowest rank at each step, falls from P n^2 to (P + 1) n^2 / 2.
    assert sum(map(sum, zig)) == sum(map(sum, con))
    assert sum(max(w[t] for w in con) for t in range(p)) == p * n * n
    assert sum(max(w[t] for w in zig) for t in range(p)) == (p + 1) * n * n // 2


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [True, False])
def test_work_equals_the_full_mask_for_many_sizes(layout, causal):
    for world_size in (1, 2, 3, 5, 8):
        for chunk in (1, 2, 7):
            seq = 2 * world_size * chunk
            assert ring_attention_work(seq, world_size, layout, causal) == \
                _brute_force_work(seq, world_size, layout, causal), (world_size, chunk)


def test_non_causal_work_is_every_block_in_full():
    assert ring_attention_work(12, 3, "zigzag", causal=False) == [[16] * 3] * 3


def test_ring_step_costs_and_the_overlap_threshold():
    byt, flops = ring_step_costs(1024, heads=32, kv_heads=8, head_dim=128, batch=1, element_size=2)
    assert byt == 2 * 8 * 1024 * 128 * 2 and flops == 4 * 32 * 1024 ** 2 * 128
    rate, bw = 1e15, 50e9
    n_star = min_local_seq_to_hide(32, 8, rate, bw)
    step_bytes, step_flops = ring_step_costs(round(n_star), 32, 8, 128)
    assert math.isclose(step_bytes / bw, step_flops / rate, rel_tol=1e-3)  # the threshold: both take as long
    assert min_local_seq_to_hide(32, 8, rate, bw, compute_fraction=0.5) == 2 * n_star


def _work_done(rank, world_size, seq, layout):
    """Score entries ring_attention's forward computes on this rank, recorded from its block products."""
    import utils.parallel.frontier.context_parallel as cp

    done, scores = [], cp._scores

    def recording(*args):
        s = scores(*args)
        done.append(s.shape[-2:].numel())
        return s

    cp._scores = recording  # this forked worker's copy of the module only
    q, k, v, _ = (shard_sequence(t, rank, world_size, layout) for t in _qkv_grad(seq, torch.float64))
    ring_attention(q, k, v, causal=True, layout=layout)
    return done


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ring_attention_computes_the_work_ring_attention_work_counts(layout):
    seq, p = 24, 3
    expected = ring_attention_work(seq, p, layout)
    for rank, done in enumerate(launch(_work_done, p, seq, layout, timeout=60)):
        assert done == [w for w in expected[rank] if w], rank  # fully masked blocks are skipped, not computed


def _subgroups(rank, world_size, seq, layout):
    """Two rings of two ranks each, {0, 2} and {1, 3}: the ring follows the group's ranks, not the world's."""
    import torch.distributed as dist

    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    group, group_rank = groups[rank % 2], rank // 2
    q, k, v, d_out = (shard_sequence(t, group_rank, 2, layout) for t in _qkv_grad(seq, torch.float64, seed=rank % 2))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = ring_attention(q, k, v, causal=True, group=group, layout=layout)
    out.backward(d_out)
    return out.detach(), q.grad, k.grad, v.grad


def test_ring_attention_on_subgroups_equals_sdpa_per_group():
    seq, layout = 8, "zigzag"
    per_rank = launch(_subgroups, 4, seq, layout, timeout=90)
    for seed, members in ((0, (0, 2)), (1, (1, 3))):
        q, k, v, d_out = _qkv_grad(seq, torch.float64, seed=seed)
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(d_out)
        for i, want in enumerate((out.detach(), q.grad, k.grad, v.grad)):
            got = unshard_sequence([per_rank[m][i] for m in members], layout)
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def _gqa(rank, world_size, seq, layout):
    g = torch.Generator().manual_seed(1)
    q, k, v, d_out = (torch.randn(B, h, seq, D, generator=g, dtype=torch.float64) for h in (4, 2, 2, 4))
    q, k, v, d_out = (shard_sequence(t, rank, world_size, layout) for t in (q, k, v, d_out))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = ring_attention(q, k, v, causal=True, layout=layout)
    out.backward(d_out)
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_grouped_query_ring_attention_equals_sdpa_with_gqa(layout):
    seq = 16
    per_rank = launch(_gqa, 2, seq, layout, timeout=90)
    g = torch.Generator().manual_seed(1)
    q, k, v, d_out = (torch.randn(B, h, seq, D, generator=g, dtype=torch.float64) for h in (4, 2, 2, 4))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out.backward(d_out)
    for i, want in enumerate((out.detach(), q.grad, k.grad, v.grad)):
        got = unshard_sequence([r[i] for r in per_rank], layout)
        assert got.shape == want.shape  # dk and dv keep the 2 KV heads
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("layout, causal, fraction", [
    ("contiguous", False, 1.0),
    ("contiguous", True, 1.0),  # causal, but at every step some rank computes a full block: no slack gained
    ("zigzag", True, 0.5),      # every step after the first is half a block: the transfer needs twice the tokens
])
def test_simulated_ring_hides_the_transfer_exactly_above_the_closed_form_threshold(layout, causal, fraction):
    """H100 SXM (bf16 dense peak, NVLink per direction) with Llama-3-405B-like heads: 128 query, 8 KV heads."""
    from utils.gpu.hardware import spec

    h100 = spec("H100-SXM")
    rate, bw, p = h100.flops("bf16"), h100.nvlink_bandwidth / 2, 4
    args = dict(world_size=p, heads=128, kv_heads=8, head_dim=128, flops_per_s=rate, layout=layout, causal=causal)
    n_star = min_local_seq_to_hide(128, 8, rate, bw, compute_fraction=fraction)
    assert math.isclose(n_star, 2 * rate * 8 / (2 * fraction * 128 * bw))
    for n in (2 * math.floor(n_star / 2) - 8, 2 * math.ceil(n_star / 2) + 8):  # just below, just above (even n)
        with_link = ring_attention_seconds(p * n, bandwidth_bytes_per_s=bw, **args)
        free_link = ring_attention_seconds(p * n, bandwidth_bytes_per_s=1e30, **args)
        assert (with_link == free_link) == (n > n_star), n
