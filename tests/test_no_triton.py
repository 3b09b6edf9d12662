"""The stand-ins of :mod:`utils.no_triton`, and the kernels' modules on a machine without Triton."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from utils import device, no_triton

ROOT = Path(__file__).resolve().parent.parent


def test_a_stand_in_kernel_is_readable_and_refuses_to_launch_saying_why():
    @no_triton.triton.jit
    def copy_kernel(x_ptr, n, BLOCK_SIZE: no_triton.tl.constexpr):
        """Copies."""

    assert copy_kernel.__name__ == "copy_kernel" and copy_kernel.__doc__ == "Copies."
    with pytest.raises(RuntimeError, match="copy_kernel is a Triton kernel") as err:
        copy_kernel[(4,)](None, 4, BLOCK_SIZE=16)
    assert device.NO_TRITON in str(err.value)
    assert isinstance(no_triton.triton.autotune(configs=[], key=["n"])(copy_kernel), no_triton.Kernel)
    assert isinstance(no_triton.triton.jit(do_not_specialize=["n"])(lambda n: n), no_triton.Kernel)


def test_the_plain_python_parts_work():
    triton = no_triton.triton
    assert [triton.cdiv(n, 256) for n in (1, 256, 257)] == [1, 1, 2]
    assert [triton.next_power_of_2(n) for n in (0, 1, 5, 64, 65)] == [1, 1, 8, 64, 128]
    config = triton.Config({"BLOCK_M": 64}, num_warps=8, num_stages=2)
    assert (config.kwargs, config.num_warps, config.num_stages) == ({"BLOCK_M": 64}, 8, 2)
    with pytest.raises(AttributeError, match="Linux only"):
        triton.testing


BLOCKED = """
import sys
sys.modules["triton"] = None  # as on macOS or Windows: no wheel, no module
import torch
import utils
from utils import device
assert not device.HAS_TRITON
assert device.require_triton("This check") is False
from utils.kernels import flash_attention, flash_attention_backward, flash_attention_hopper, llama_ops
from utils.kernels import matmul, matmul_persistent, paged_attention, sfu, softmax, vector_add
from utils.kernels import fused_linear_cross_entropy, quant_matmul, split_kv_decode
assert fused_linear_cross_entropy.peak_logits_nbytes(8192, 128256, 1024) == 1024 * 128256 * 4
assert split_kv_decode.choose_num_splits(1, 8, 32768, 132) == 33 and quant_matmul.kernel_block_k(4, 128) == 128
assert len(matmul.AUTOTUNE_CONFIGS) == 10 and matmul.tile_intensity(128, 256, 64, 2) > 0
assert torch.allclose(softmax.softmax_unfused(torch.zeros(2, 4)), torch.full((2, 4), 0.25))
try:
    vector_add.add(torch.ones(8), torch.ones(8))
except RuntimeError as err:
    print(err)
"""


def test_utils_kernels_import_without_triton_and_launching_says_why():
    """A fresh interpreter without triton: every kernel module imports, its plain-Python helpers work."""
    done = subprocess.run([sys.executable, "-c", BLOCKED], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [f"This check needs Triton: {device.NO_TRITON}",
                     f"add_kernel is a Triton kernel and cannot run here. {device.NO_TRITON}"]
