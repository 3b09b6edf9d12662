"""utils.kernels.quant_matmul: the int4 / int8 dequantise-in-registers matmul against x @ dequantize(...).T."""

import pytest
import torch

from utils import device
from utils.kernels.quant_matmul import kernel_block_k, quant_matmul, weight_nbytes
from utils.serving.quantisation.quant import dequantize, quantize

TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-4), torch.float16: dict(rtol=1e-2, atol=1e-2)}


def _problem(m, n, k, bits, group_size, dtype, seed=0):
    device.manual_seed(seed)
    w = torch.randn(n, k, device=device.device()).to(dtype)
    x = torch.randn(m, k, device=device.device()).to(dtype)
    return x, quantize(w, bits, group_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bits,group_size", [(4, 32), (4, 64), (8, 16), (8, 32)])
@pytest.mark.parametrize("m", [1, 5, 16])
def test_equals_x_times_the_dequantised_weight(dtype, bits, group_size, m):
    x, (q, scales, zeros) = _problem(m, 40, 128, bits, group_size, dtype)  # n = 40: a partly filled tile
    y = quant_matmul(x, q, scales, zeros, group_size, bits, block_n=16)
    want = x.double() @ dequantize(q, scales, zeros, group_size, bits).double().T
    assert y.shape == (m, 40) and y.dtype == dtype
    torch.testing.assert_close(y.double(), want, **TOLERANCE[dtype])


def test_more_rows_than_one_tile_and_a_large_group():
    x, (q, scales, zeros) = _problem(20, 16, 512, 4, 256, torch.float32)  # two M tiles; two K steps per group
    want = x.double() @ dequantize(q, scales, zeros, 256, 4).double().T
    torch.testing.assert_close(quant_matmul(x, q, scales, zeros, 256, 4, block_n=16).double(), want,
                               **TOLERANCE[torch.float32])


def test_block_k_and_refusals():
    assert [kernel_block_k(4, g) for g in (32, 128, 256)] == [32, 128, 128]
    with pytest.raises(ValueError, match="power of two >= 32 for int4"):
        kernel_block_k(4, 16)
    with pytest.raises(ValueError, match="power of two >= 16 for int8"):
        kernel_block_k(8, 48)
    x, (q, scales, zeros) = _problem(2, 16, 64, 4, 32, torch.float32)
    with pytest.raises(ValueError, match="q must be"):
        quant_matmul(x[:, :32], q, scales, zeros, 32, 4)
    with pytest.raises(ValueError, match="bits must be"):
        quant_matmul(x, q, scales, zeros, 32, 3)
    with pytest.raises(ValueError, match="uint8"):
        quant_matmul(x, q.int(), scales, zeros, 32, 4)


@pytest.mark.skipif(not device.INTERPRETER, reason="bf16 is refused only under the interpreter")
def test_bf16_is_refused_under_the_interpreter():
    x, (q, scales, zeros) = _problem(1, 16, 64, 4, 32, torch.float32)
    with pytest.raises(ValueError, match="bfloat16"):
        quant_matmul(x.bfloat16(), q, scales, zeros, 32, 4)


def test_weight_nbytes_counts_what_quantize_stores():
    for bits, group_size in ((4, 32), (8, 64)):
        _, (q, scales, zeros) = _problem(1, 24, 256, bits, group_size, torch.float16)
        stored = sum(t.numel() * t.element_size() for t in (q, scales, zeros))
        assert weight_nbytes(24, 256, bits, group_size) == stored
