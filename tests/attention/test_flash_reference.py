import math

import pytest
import torch

from utils.attention.flash_reference import (
    attention_hbm_bytes,
    kv_l2_to_sm_bytes,
    kv_working_set_bytes,
    attention_reference,
    online_softmax_steps,
    tiled_attention,
)


def test_online_softmax_worked_example():
    """x1 = [1, 2], x2 = [3, 4]: after the first block m = 2, l = e^-1 + 1; after the second, softmax of all four."""
    first, last = online_softmax_steps([[1, 2], [3, 4]])
    assert first.m == 2 and first.l == pytest.approx(math.exp(-1) + 1)
    full = torch.softmax(torch.tensor([1.0, 2, 3, 4], dtype=torch.float64), 0).tolist()
    assert last.m == 4 and last.probabilities == pytest.approx(full)
    with pytest.raises(ValueError, match="non-empty"):
        online_softmax_steps([[1.0], []])


@pytest.mark.parametrize("causal, n_q, n_k, d, block_q, block_k", [
    (False, 37, 37, 16, 16, 8), (True, 37, 37, 16, 16, 8), (False, 5, 70, 8, 4, 32),
    (False, 64, 64, 32, 64, 64), (True, 64, 64, 32, 64, 64)])
def test_tiled_forward_and_gradients_match_float64(causal, n_q, n_k, d, block_q, block_k):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, d, dtype=torch.float64, requires_grad=True) for n in (n_q, n_k, n_k))
    d_out = torch.randn(2, 3, n_q, d, dtype=torch.float64)
    expected = attention_reference(q, k, v, causal)
    grads = torch.autograd.grad(expected, (q, k, v), d_out)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    got = tiled_attention(q32, k32, v32, causal, block_q=block_q, block_k=block_k)
    got_grads = torch.autograd.grad(got, (q32, k32, v32), d_out.float())
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    for g, e in zip(got_grads, grads):
        torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=1e-4)


def test_matches_sdpa():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 50, 16) for _ in range(3))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(tiled_attention(q, k, v, causal=True, block_q=16, block_k=16), expected)


@pytest.mark.parametrize("args, match", [
    ((torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.zeros(1, 2, 3)), "4-D"),
    ((torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 6, 4)), "do not match"),
    ((torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 5, 8)), "do not match"),
])
def test_bad_shapes_raise(args, match):
    with pytest.raises(ValueError, match=match):
        tiled_attention(*args)


def test_causal_needs_square_attention():
    with pytest.raises(ValueError, match="causal"):
        tiled_attention(torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 5, 4), torch.zeros(1, 1, 5, 4), causal=True)


def test_flash_reads_far_fewer_bytes_at_long_sequences():
    """Dao et al. 2022, section 3.2: Theta(N^2 d / B_r) HBM accesses against Theta(N d + N^2)."""
    standard, flash = attention_hbm_bytes(4096, 64)
    assert standard == (4 * 4096 * 64 + 4 * 4096 ** 2) * 2
    assert flash == (2 * 4096 * 64 + 2 * 32 * 4096 * 64) * 2 + 4 * 4096
    assert flash < standard / 3
    s1, f1 = attention_hbm_bytes(2048, 128)
    s2, f2 = attention_hbm_bytes(4096, 128)
    assert s2 / s1 == pytest.approx(4, rel=0.05) and f2 / f1 == pytest.approx(4, rel=0.05)


@pytest.mark.parametrize("causal", [False, True])
def test_float64_inputs_are_computed_in_float64(causal):
    """A float64 check at float64 tolerances: the tiles must not be computed in float32 (they once were)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 45, 32, dtype=torch.float64, requires_grad=True) for _ in range(3))
    d_out = torch.randn(2, 3, 45, 32, dtype=torch.float64)
    expected = attention_reference(q, k, v, causal)
    got = tiled_attention(q, k, v, causal, block_q=16, block_k=16)
    torch.testing.assert_close(got, expected)  # float64 defaults: rtol 1e-7, atol 1e-7
    for g, e in zip(torch.autograd.grad(got, (q, k, v), d_out), torch.autograd.grad(expected, (q, k, v), d_out)):
        assert g.dtype == torch.float64
        torch.testing.assert_close(g, e)


def test_l2_reuse_reads_k_and_v_once_from_hbm():
    n, d = 4096, 128
    _, no_reuse = attention_hbm_bytes(n, d, block_rows=64)
    standard, l2 = attention_hbm_bytes(n, d, block_rows=64, kv_reuse="l2")
    assert l2 == 4 * n * d * 2 + 4 * n  # Q, K, V, O once, plus fp32 log-sum-exps
    assert no_reuse == (2 * n * d + 2 * 64 * n * d) * 2 + 4 * n  # T_r = 64 passes over K and V
    assert attention_hbm_bytes(n, d, block_rows=16, kv_reuse="l2")[1] == l2  # the tile no longer matters
    assert standard == attention_hbm_bytes(n, d)[0]
    # the re-reads still cross L2 -> SM: 2 T_r N d elements, an intensity of 2 B_r / element_size = B_r in fp16
    assert kv_l2_to_sm_bytes(n, d, block_rows=64) == 2 * 64 * n * d * 2
    assert 4 * n * n * d / kv_l2_to_sm_bytes(n, d, block_rows=64) == pytest.approx(64)


def test_recorded_rate_refutes_the_hbm_reread_model_and_fits_the_l2_one():
    """benchmarks/results: the 64 x 64 kernel runs above the roof of the paper's count; the harness's intensity is N/2."""
    from utils import recorded
    from utils.gpu import hardware

    h100 = hardware.spec("H100-SXM")
    data = recorded.load()
    for n in (4096, 8192):
        row = next(r for r in data["results"]
                   if r["kernel"] == "flash_attention fwd" and r["shape"] == f"b4 h16 n{n} d128 float16")
        flops = 4 * n * n * 128
        _, reread = attention_hbm_bytes(n, 128, block_rows=64)  # the kernel's default tiles (_blocks)
        _, once = attention_hbm_bytes(n, 128, block_rows=64, kv_reuse="l2")
        assert row["value"] * 1e12 > 1.5 * flops / reread * h100.hbm_bandwidth  # refuted by a wide margin
        assert row["intensity"] == pytest.approx(flops / once, rel=1e-2)  # the harness's N / 2 (no log-sum-exps)
        # 132 SMs, up to 2 programs each: the K/V of the heads in flight fit the 50 MB L2 with room to spare
        assert kv_working_set_bytes(n, 128, 2 * h100.sm_count, block_rows=64) < h100.l2_bytes / 2


def test_working_set_counts_the_heads_a_window_of_programs_spans():
    n, d = 1024, 64  # T_r = 8 row tiles of 128
    assert kv_working_set_bytes(n, d, 1) == 2 * n * d * 2
    assert kv_working_set_bytes(n, d, 8) == 2 * (2 * n * d * 2)  # 8 consecutive programs may straddle two heads
    assert kv_working_set_bytes(n, d, 9) == 2 * (2 * n * d * 2)
    assert kv_working_set_bytes(n, d, 10) == 3 * (2 * n * d * 2)


@pytest.mark.parametrize("call, match", [
    (lambda: attention_hbm_bytes(64, 16, kv_reuse="smem"), "kv_reuse"),
    (lambda: kv_working_set_bytes(64, 16, 0), "programs_in_flight"),
    (lambda: kv_l2_to_sm_bytes(64, 16, block_rows=0), "block_rows"),
])
def test_bad_traffic_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_tiled_attention_uses_the_given_scale_by_hand():
    # One query q = 1 (d = 1) over keys (0, 2 ln 3) and values (0, 4), one key per tile, sm_scale 0.5: scores
    # (0, ln 3), weights (1/4, 3/4), output 3 (the default 1/sqrt(d) = 1 would give weights 1:9 and 3.6).
    # dO/dq = scale * sum_j p_j (v_j - O) k_j = 0.5 * 3/4 * 1 * 2 ln 3 = 0.75 ln 3.
    ln3 = math.log(3.0)
    q = torch.ones(1, 1, 1, 1, dtype=torch.float64, requires_grad=True)
    k = torch.tensor([0.0, 2 * ln3], dtype=torch.float64).view(1, 1, 2, 1)
    v = torch.tensor([0.0, 4.0], dtype=torch.float64).view(1, 1, 2, 1)
    for attend in (attention_reference, lambda *a, **kw: tiled_attention(*a, **kw, block_q=1, block_k=1)):
        out = attend(q, k, v, sm_scale=0.5)
        assert out.item() == pytest.approx(3.0)
        dq, = torch.autograd.grad(out.sum(), q)
        assert dq.item() == pytest.approx(0.75 * ln3)


def test_a_partial_row_tile_counts_as_a_pass_over_k_and_v():
    # N = 1000 in tiles of 128 rows: 7 full tiles and one of 104, T_r = ceil(1000 / 128) = 8 passes over K and V.
    n, d = 1000, 64
    assert attention_hbm_bytes(n, d, block_rows=128)[1] == (2 * n * d + 2 * 8 * n * d) * 2 + 4 * n
    assert kv_l2_to_sm_bytes(n, d, block_rows=128) == 2 * 8 * n * d * 2
    # 9 programs in flight over 8 row tiles per head span ceil(8 / 8) + 1 = 2 heads (7 tiles would give 3)
    assert kv_working_set_bytes(n, d, 9, block_rows=128) == 2 * (2 * n * d * 2)
