"""What fusing saves: AdamW's bytes per parameter counted from its passes, the logits' bytes, the largest-tensor probe."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from utils.production import fused_training as ft  # noqa: E402


def test_adamw_bytes_by_hand():
    """Fused: read p, g, m, v and write p, m, v: 7 x 4 = 28 B. Foreach: 20 fp32 accesses over 8 passes, 80 B."""
    assert ft.adamw_bytes_per_param("fused") == 28
    assert ft.adamw_bytes_per_param("foreach") == 80
    assert len(ft.ADAMW_FOREACH_PASSES) == 8
    assert ft.adamw_bytes_per_param("fused", element_bytes=2) == 14
    # Llama 3 8B's 8.03e9 parameters on one H100 (3.35 TB/s): 67 ms fused, 192 ms foreach
    assert ft.adamw_step_seconds(8.03e9, 3.35e12, "fused") == pytest.approx(8.03e9 * 28 / 3.35e12)
    assert ft.adamw_step_seconds(8.03e9, 3.35e12, "foreach") / ft.adamw_step_seconds(8.03e9, 3.35e12) == \
        pytest.approx(80 / 28)


def test_the_foreach_passes_are_torchs():
    """Every operation named in ADAMW_FOREACH_PASSES is called by the installed torch's multi-tensor Adam."""
    import inspect

    from torch.optim import adam
    source = inspect.getsource(adam._multi_tensor_adam)
    for p in ft.ADAMW_FOREACH_PASSES:
        op = p.op.split("(")[0].split("= ")[-1]
        assert f"torch.{op}(" in source, op


def test_loss_memory_for_llama3_8b():
    """8,192 tokens x 128,256 words x 4 B = 4.2 GB per N x V tensor; the fused loss: one 1,024-token chunk
    (0.53 GB) and grad_hidden + grad_weight ((8,192 + 128,256) x 4,096 x 4 B = 2.24 GB)."""
    m = ft.loss_memory(8192, 128_256, 4096, chunk=1024)
    assert m.unfused_saved == m.unfused_grad_in == m.unfused_grad_out == 8192 * 128_256 * 4
    assert m.fused_chunk == 1024 * 128_256 * 4
    assert m.fused_saved == (8192 + 128_256) * 4096 * 4
    assert ft.loss_memory(100, 1000, 8, chunk=1024).fused_chunk == 100 * 1000 * 4  # a chunk never exceeds N


def test_the_probe_sees_the_largest_tensor():
    hidden, weight = torch.randn(64, 8, requires_grad=True), torch.randn(500, 8, requires_grad=True)
    targets = torch.randint(0, 500, (64,))
    with ft.LargestTensors() as probe:
        F.cross_entropy(hidden @ weight.T, targets).backward()
    assert probe.largest_nbytes() == 64 * 500 * 4
    with pytest.raises(ValueError, match="no tensor was recorded of dtype"):
        probe.largest_nbytes(torch.complex64)


def test_plot_and_bad_input():
    fig = ft.plot_logits_memory(vocab=32_000, tokens=4096, chunk=512, hidden=4096)
    assert len(fig.axes[0].patches) == 5
    with pytest.raises(ValueError, match="implementation must be one of"):
        ft.adamw_bytes_per_param("apex")
    with pytest.raises(ValueError, match="chunk must be a positive int"):
        ft.loss_memory(10, 10, 10, chunk=0)
    with pytest.raises(ValueError, match="n_params must be a finite number > 0"):
        ft.adamw_step_seconds(0, 1e12)
