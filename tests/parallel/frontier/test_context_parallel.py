"""utils.parallel.frontier.context_parallel: ring attention on 2, 3 and 4 gloo ranks equals SDPA on one process
(outputs and dq, dk, dv), causal or not, contiguous or zigzag; on 3 ranks, the smallest ring whose two neighbours
differ, every send goes right and every receive comes from the left, the bytes sent are the cost model's, and the
dK/dV hop overlaps the next step's compute; shard/unshard round-trips; the causal work per rank (zigzag balanced,
contiguous P times apart) and that the ring computes exactly that; grouped-query heads; subgroups; the cost model,
forward and backward, against its step-by-step simulation; bad inputs raise ValueError."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.parallel import value_error_messages
from utils.dist import WorkerError, launch
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


def _recorded(rank, world_size, seq, layout, dtype):
    """_ring (causal) with every point-to-point op checked as it is posted, and the ring's events recorded.

    A ring sends to rank r + 1 and receives from rank r - 1, K/V (tag 0) and dK/dV (tag 1) alike: an op to or
    from any other rank raises at once, naming the rank, instead of leaving the ranks waiting on each other.
    Returns the events in order: ("post", phase, tag, bytes sent), ("wait", phase, tag), ("compute", phase).
    """
    import torch.distributed as dist

    import utils.parallel.frontier.context_parallel as cp

    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    events, phase = [], ["forward"]
    post, scores = dist.batch_isend_irecv, cp._scores

    class Logged:
        def __init__(self, work, tag):
            self.work, self.tag = work, tag

        def wait(self):
            events.append(("wait", phase[0], self.tag))
            return self.work.wait()

    def checked(ops):
        for op in ops:
            sends = op.op is dist.isend
            what = {0: "K/V block", 1: "dK/dV accumulators"}.get(op.tag, f"tag {op.tag}")
            want = right if sends else left
            if op.peer != want:
                raise AssertionError(
                    f"rank {rank} of {world_size} {'sends its' if sends else 'receives a'} {what} "
                    f"{'to' if sends else 'from'} rank {op.peer}, but a ring sends to rank r + 1 = {right} and "
                    f"receives from rank r - 1 = {left} (2 ranks cannot show this: there both neighbours are one rank)")
        sent = sum(op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend)
        events.append(("post", phase[0], ops[0].tag, sent))
        return [Logged(w, ops[0].tag) for w in post(ops)]

    def computing(*args):
        events.append(("compute", phase[0]))
        return scores(*args)

    dist.batch_isend_irecv, cp._scores = checked, computing  # this forked worker's copies only
    q, k, v, d_out = (shard_sequence(t, rank, world_size, layout) for t in _qkv_grad(seq, dtype))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = ring_attention(q, k, v, causal=True, layout=layout)
    phase[0] = "backward"
    out.backward(d_out)
    return events, [out.detach(), q.grad, k.grad, v.grad]


def _launch_three(seq, layout, dtype):
    """_recorded on 3 ranks, failing within seconds, with a reason, if the ranks wait on each other."""
    try:
        return launch(_recorded, 3, seq, layout, dtype, timeout=20)
    except TimeoutError as error:
        pytest.fail("ring attention on 3 ranks hung for 20 s: a send that no rank receives, or a receive that no "
                    "rank sends (a ring shifted the wrong way on one side?)\n" + str(error).splitlines()[0])


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_a_ring_of_three_sends_right_receives_from_the_left_and_equals_sdpa_on_every_rank(layout):
    """3 ranks is the smallest ring where the right and left neighbours differ: with 2 a ring sent the wrong way is
    invisible. A misdirected op fails at once (_recorded), and each rank's rows are checked by name."""
    seq = 36
    per_rank = _launch_three(seq, layout, torch.float64)
    expected = [shard for shard in _sdpa(seq, True, torch.float64)]
    for rank, (_, got) in enumerate(per_rank):
        for name, g, e in zip(("out", "dq", "dk", "dv"), got, expected):
            torch.testing.assert_close(g, shard_sequence(e, rank, 3, layout), rtol=1e-10, atol=1e-12,
                                       msg=lambda m, name=name, rank=rank: f"rank {rank} of 3, {name}: {m}")


def test_the_checked_ring_names_a_misdirected_send_at_once():
    """The direction check itself: a worker whose ring is turned round fails in seconds, naming the rank."""
    def turned(rank, world_size):
        import utils.parallel.frontier.context_parallel as cp

        info = cp._ring_info
        cp._ring_info = lambda group: (lambda p, r, right, left: (p, r, left, right))(*info(group))
        return _recorded(rank, world_size, 12, "contiguous", torch.float64)

    with pytest.raises(WorkerError, match=r"rank \d of 3 sends its K/V block to rank \d, but a ring sends to"):
        launch(turned, 3, timeout=20)


def test_backward_traffic_is_kv_in_its_dtype_and_fp32_accumulators_three_times_the_forward_for_bf16():
    seq, p = 36, 3
    per_rank = _launch_three(seq, "zigzag", torch.bfloat16)
    kv_bytes, _ = ring_step_costs(seq // p, H, H, D, batch=B, element_size=2)
    step_bytes, _ = ring_step_costs(seq // p, H, H, D, batch=B, element_size=2, backward=True)
    for rank, (events, _) in enumerate(per_rank):
        sent = {(phase, tag): [e[3] for e in events if e[:3] == ("post", phase, tag)]
                for phase in ("forward", "backward") for tag in (0, 1)}
        assert sent["forward", 0] == [kv_bytes] * (p - 1) and not sent["forward", 1], rank  # bf16 K and V
        assert sent["backward", 0] == [kv_bytes] * (p - 1), rank  # K and V again, still bf16
        assert sent["backward", 1] == [2 * kv_bytes] * p, rank  # dK, dV in fp32, P hops to come home
        assert kv_bytes + 2 * kv_bytes == step_bytes == 3 * kv_bytes


def test_each_dkv_hop_but_the_last_is_waited_on_only_after_the_next_steps_compute():
    per_rank = _launch_three(36, "zigzag", torch.float64)  # zigzag: every rank computes at every step
    for rank, (events, _) in enumerate(per_rank):
        backward = [e for e in events if e[1] == "backward"]
        posts = [i for i, e in enumerate(backward) if e[0] == "post" and e[2] == 1]
        waits = [i for i, e in enumerate(backward) if e[0] == "wait" and e[2] == 1]
        assert len(posts) == 3 and len(waits) == 2 * 3, rank  # a send and a receive per hop
        for hop, start in enumerate(posts[:-1]):
            first_wait = min(i for i in waits if i > start)
            overlapped = [e for e in backward[start:first_wait] if e[0] == "compute"]
            assert overlapped, f"rank {rank}: dK/dV hop {hop} was waited on before any compute ran behind it"


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
    lambda: ring_step_costs(8, 8, 8, 64, backward=True, grad_element_size=3),
    lambda: min_local_seq_to_hide(8, 8, 1e15, 1e11, backward=True, grad_element_size=0),
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


def test_backward_step_costs_and_threshold_by_hand():
    # n = 1024 tokens, 32 query and 8 KV heads of 128, bf16 K/V, fp32 dK/dV: (2 + 4) bytes per element of K and V.
    byt, flops = ring_step_costs(1024, heads=32, kv_heads=8, head_dim=128, backward=True)
    assert byt == 2 * 8 * 1024 * 128 * (2 + 4) == 3 * ring_step_costs(1024, 32, 8, 128)[0]
    assert flops == 10 * 32 * 1024 ** 2 * 128 == 2.5 * ring_step_costs(1024, 32, 8, 128)[1]
    assert ring_step_costs(1024, 32, 8, 128, backward=True, grad_element_size=2)[0] == 2 * 8 * 1024 * 128 * 4
    rate, bw = 1e15, 50e9
    n_fwd, n_bwd = min_local_seq_to_hide(32, 8, rate, bw), min_local_seq_to_hide(32, 8, rate, bw, backward=True)
    assert n_bwd == (2 + 4) * rate * 8 / (5 * 32 * bw) and math.isclose(n_bwd / n_fwd, 1.2)
    assert math.isclose(min_local_seq_to_hide(32, 8, rate, bw, backward=True, grad_element_size=2) / n_fwd, 0.8)
    step_bytes, step_flops = ring_step_costs(round(n_bwd), 32, 8, 128, backward=True)
    assert math.isclose(step_bytes / bw, step_flops / rate, rel_tol=1e-3)  # the threshold: both take as long


def test_backward_simulation_by_hand_on_two_ranks():
    # P = 2, non-causal, 1 head of 1 dim, 1 token per rank, bf16 (e = 2) and fp32 accumulators (4): K/V 4 bytes,
    # dK/dV 8. Step 0 carries K/V (4 B), step 1 the step-0 accumulators (8 B), then the last hop (8 B) alone.
    kw = dict(heads=1, kv_heads=1, head_dim=1, flops_per_s=10.0, bandwidth_bytes_per_s=1.0, causal=False)
    assert ring_attention_seconds(2, 2, **kw) == max(4 / 10, 4.0) + 4 / 10
    assert ring_attention_seconds(2, 2, backward=True, **kw) == max(10 / 10, 4.0) + max(10 / 10, 8.0) + 8.0


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
    for rank, done in enumerate(launch(_work_done, p, seq, layout, timeout=30)):
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


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("layout, causal, fraction", [
    ("contiguous", False, 1.0),
    ("contiguous", True, 1.0),  # causal, but at every step some rank computes a full block: no slack gained
    ("zigzag", True, 0.5),      # every step after the first is half a block: the transfer needs twice the tokens
])
def test_simulated_ring_hides_the_transfer_exactly_above_the_closed_form_threshold(layout, causal, fraction,
                                                                                   backward):
    """H100 SXM (bf16 dense peak, NVLink per direction) with Llama-3-405B-like heads: 128 query, 8 KV heads.

    The backward's last dK/dV hop has nothing to hide behind: above the threshold it is all that is exposed."""
    from utils.gpu.hardware import spec

    h100 = spec("H100-SXM")
    rate, bw, p = h100.flops("bf16"), h100.nvlink_bandwidth / 2, 4
    args = dict(world_size=p, heads=128, kv_heads=8, head_dim=128, flops_per_s=rate, layout=layout, causal=causal,
                backward=backward)
    n_star = min_local_seq_to_hide(128, 8, rate, bw, compute_fraction=fraction, backward=backward)
    per_element = 2 * (2 + 4) / 10 if backward else 2 * 2 / 4  # bytes per FLOP coefficient: 2 (e + e_grad) / 10, 2e / 4
    assert math.isclose(n_star, per_element * rate * 8 / (fraction * 128 * bw))
    for n in (2 * math.floor(n_star / 2) - 8, 2 * math.ceil(n_star / 2) + 8):  # just below, just above (even n)
        with_link = ring_attention_seconds(p * n, bandwidth_bytes_per_s=bw, **args)
        free_link = ring_attention_seconds(p * n, bandwidth_bytes_per_s=1e30, **args)
        last_hop = 2 * 8 * n * 128 * 4 / bw if backward else 0.0
        assert math.isclose(with_link - free_link, last_hop, rel_tol=1e-9, abs_tol=1e-15) == (n > n_star), n
