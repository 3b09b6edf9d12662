import pytest
import torch

from utils.attention.flash_reference import attention_reference, tiled_attention
from utils.attention.peak_memory import peak_tensor_bytes

MB = 4 * 1000 * 1000  # a 1000 x 1000 float32 tensor


def test_freed_temporaries_do_not_add_up():
    def fn():
        a = torch.ones(1000, 1000)
        b = a * 2          # a and b live: 2 MB-units
        del a
        c = b + 1          # b and c live
        del b
        return c.sum()

    _, peak = peak_tensor_bytes(fn)
    assert peak == 2 * MB  # two of the three at a time (the 4-byte sum comes after b is freed)


def test_views_share_storage_and_kept_results_count():
    def fn():
        a = torch.zeros(1000, 1000)
        return [a.view(-1), a.t(), a[:10]]

    _, peak = peak_tensor_bytes(fn)
    assert peak == MB


def test_standard_attention_holds_the_score_matrix():
    """Standard attention materialises S and P (N x N each); the tiled path only block_q x block_k tiles."""
    n, d = 512, 16
    q, k, v = (torch.randn(1, 1, n, d) for _ in range(3))
    _, standard = peak_tensor_bytes(lambda: attention_reference(q, k, v))
    _, tiled = peak_tensor_bytes(lambda: tiled_attention(q, k, v, block_q=64, block_k=64))
    assert standard >= 2 * n * n * 4
    assert tiled < n * n * 4 / 4


def test_rejects_non_callable():
    with pytest.raises(ValueError, match="callable"):
        peak_tensor_bytes(3)
