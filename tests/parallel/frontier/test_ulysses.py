"""utils.parallel.frontier.ulysses: Ulysses attention on 2 and 4 gloo ranks equals SDPA on one process (outputs and
dq, dk, dv), causal or not, with grouped-query heads; the two all-to-alls invert each other and move heads as stated;
the byte count against the paper's 4Nh/P; bad head counts raise ValueError."""

import pytest
import torch
import torch.nn.functional as F

from tests.parallel import value_error_messages
from utils.dist import launch
from utils.parallel.frontier.context_parallel import shard_sequence, unshard_sequence
from utils.parallel.frontier.ulysses import (
    check_ulysses_degree,
    heads_to_sequence,
    sequence_to_heads,
    ulysses_attention,
    ulysses_bytes_per_gpu,
)

B, S, D = 2, 16, 8


def _qkv_grad(heads, kv_heads, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, heads, S, D), (B, kv_heads, S, D), (B, kv_heads, S, D), (B, heads, S, D)]
    return [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]  # q, k, v, dO


def _ulysses(rank, world_size, heads, kv_heads, causal):
    q, k, v, d_out = (shard_sequence(t, rank, world_size) for t in _qkv_grad(heads, kv_heads))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = ulysses_attention(q, k, v, causal=causal)
    out.backward(d_out)
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("world_size,heads,kv_heads", [(2, 4, 4), (2, 4, 2), (4, 8, 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_ulysses_equals_sdpa_outputs_and_gradients(world_size, heads, kv_heads, causal):
    per_rank = launch(_ulysses, world_size, heads, kv_heads, causal, timeout=90)
    q, k, v, d_out = (t.requires_grad_(i < 3) for i, t in enumerate(_qkv_grad(heads, kv_heads)))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=heads != kv_heads)
    out.backward(d_out)
    for name, i, want in (("out", 0, out.detach()), ("dq", 1, q.grad), ("dk", 2, k.grad), ("dv", 3, v.grad)):
        got = unshard_sequence([r[i] for r in per_rank])
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=f"{name} differs from SDPA")


def _round_trip(rank, world_size):
    x = torch.arange(B * 4 * S * D, dtype=torch.float64).reshape(B, 4, S, D)
    local = shard_sequence(x, rank, world_size)
    by_heads = sequence_to_heads(local)
    return by_heads, heads_to_sequence(by_heads), local


def test_sequence_to_heads_gives_each_rank_its_heads_of_the_whole_sequence_and_inverts():
    for rank, (by_heads, back, local) in enumerate(launch(_round_trip, 2, timeout=60)):
        full = torch.arange(B * 4 * S * D, dtype=torch.float64).reshape(B, 4, S, D)
        assert torch.equal(by_heads, full[:, 2 * rank:2 * rank + 2])  # rank r: heads [2r, 2r + 2), all tokens
        assert torch.equal(back, local)


def _bad(rank, world_size):
    q = torch.randn(1, 3, 4, 2, dtype=torch.float64)  # 3 heads over 2 ranks
    q4, k1 = torch.randn(1, 4, 4, 2, dtype=torch.float64), torch.randn(1, 1, 4, 2, dtype=torch.float64)
    return value_error_messages([lambda: ulysses_attention(q, q, q),
                                 lambda: ulysses_attention(q4, k1, k1),  # 1 KV head over 2 ranks
                                 lambda: sequence_to_heads(q),
                                 lambda: heads_to_sequence(torch.randn(1, 2, 3, 2))])


def test_heads_not_divisible_raise_value_error_on_every_rank():
    for errors in launch(_bad, 2, timeout=60):
        assert all(e is not None for e in errors), errors
        assert "whole heads" in errors[0] and "whole heads" in errors[1]


def test_degree_is_bounded_by_the_kv_heads():
    assert check_ulysses_degree(128, 8, 8) == 8  # Llama 3 405B: 128 query heads, 8 KV heads
    with pytest.raises(ValueError, match="at most 8"):
        check_ulysses_degree(128, 8, 16)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        check_ulysses_degree(12, 8, 2)


def test_bytes_match_the_papers_count_up_to_the_share_kept_at_home():
    # Jacobs et al. 2023, section 3.2: 3Nh (q, k, v) + Nh (output) elements over P ranks: 4Nh/P per link, with
    # hidden h = heads * head_dim; each rank keeps 1/P of its slice, so it sends (P - 1)/P of that.
    n, heads, d, p = 8192, 32, 128, 8
    paper = 4 * n * heads * d / p * 2  # bf16 bytes
    assert ulysses_bytes_per_gpu(n, heads, heads, d, p) == pytest.approx(paper * (p - 1) / p)
    assert ulysses_bytes_per_gpu(n, heads, heads, d, 1) == 0  # one rank sends nothing
    # constant when N and P grow together (the paper's claim), up to (P - 1)/P
    assert ulysses_bytes_per_gpu(2 * n, heads, heads, d, 2 * p) * (2 * p) / (2 * p - 1) == pytest.approx(paper)
    # GQA: k and v shrink with the KV heads
    assert ulysses_bytes_per_gpu(n, 32, 8, d, 8) == pytest.approx(ulysses_bytes_per_gpu(n, 32, 32, d, 8) * 80 / 128)


def test_bytes_reject_bad_sizes():
    with pytest.raises(ValueError, match="equal slices"):
        ulysses_bytes_per_gpu(10, 8, 8, 4, 4)
    with pytest.raises(ValueError, match="whole heads"):
        ulysses_bytes_per_gpu(16, 6, 6, 4, 4)


def _ulysses_scaled(rank, world_size):
    two_ln3 = 2 * float(torch.tensor(3.0, dtype=torch.float64).log())
    q = torch.ones(1, 2, 2, 1, dtype=torch.float64)
    k = torch.tensor([0.0, two_ln3], dtype=torch.float64).view(1, 1, 2, 1).expand(1, 2, 2, 1)
    v = torch.tensor([0.0, 4.0], dtype=torch.float64).view(1, 1, 2, 1).expand(1, 2, 2, 1)
    q, k, v = (shard_sequence(t, rank, world_size) for t in (q, k, v))
    return ulysses_attention(q, k, v, sm_scale=0.5)


def test_ulysses_uses_the_given_softmax_scale():
    # Two tokens, d = 1, keys (0, 2 ln 3), values (0, 4), q = 1: with sm_scale 0.5 the scores are (0, ln 3), the
    # weights (1/4, 3/4) and every output 3; SDPA's default 1/sqrt(d) = 1 would give weights (1/10, 9/10), 3.6.
    for out in launch(_ulysses_scaled, 2, timeout=60):
        torch.testing.assert_close(out, torch.full((1, 2, 1, 1), 3.0, dtype=torch.float64))
