import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from utils import device

ROOT = Path(__file__).resolve().parent.parent


def test_interpreter_is_on_without_a_gpu():
    if device.HAS_CUDA:
        pytest.skip("a GPU is present; the interpreter is only forced on without one")
    assert os.environ["TRITON_INTERPRET"] == "1"
    assert device.INTERPRETER
    assert device.device() == torch.device("cpu")


def test_describe_names_the_machine():
    text = device.describe(show=False)
    assert ("CPU" in text and "interpreter" in text) if not device.HAS_CUDA else text.startswith("GPU: ")
    assert torch.__version__ in text


def test_bfloat16_is_refused_under_the_interpreter():
    if not device.INTERPRETER:
        assert device.check_dtype(torch.bfloat16) is torch.bfloat16
        return
    with pytest.raises(ValueError, match="bfloat16.*interpreter"):
        device.check_dtype(torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16"):
        device.check_tensors(torch.zeros(2, dtype=torch.bfloat16, device=device.device()))


def test_supported_dtypes_pass_and_bad_arguments_are_named():
    assert device.check_dtype(torch.float16) is torch.float16
    with pytest.raises(ValueError, match="torch.dtype"):
        device.check_dtype("float32")
    with pytest.raises(ValueError, match="argument 1"):
        device.check_tensors(torch.zeros(2, device=device.device()), [1, 2])


def test_manual_seed_makes_draws_repeat():
    device.manual_seed(3)
    a = torch.rand(4)
    device.manual_seed(3)
    assert torch.equal(a, torch.rand(4))


def test_describe_without_triton_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # as on macOS or Windows: no wheel, no module
    assert device.triton_version() is None
    text = device.describe(show=False)
    assert "without Triton" in text and "Linux only" in text and "dev container" in text
    assert torch.__version__ in text and "\n" not in text


def test_import_utils_and_describe_work_without_triton():
    """A fresh interpreter where triton cannot be imported: ``import utils`` and the first cell of every page."""
    code = "import sys; sys.modules['triton'] = None; import utils; utils.device.describe()"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert device.NO_TRITON in done.stdout


def test_require_triton_says_why_in_one_line_where_it_is_missing(monkeypatch, capsys):
    monkeypatch.setattr(device, "HAS_TRITON", True)
    assert device.require_triton("The kernel's check") is True
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(device, "HAS_TRITON", False)
    assert device.require_triton("The kernel's check") is False
    assert capsys.readouterr().out == f"The kernel's check needs Triton: {device.NO_TRITON}\n"
    with pytest.raises(ValueError, match="non-empty string"):
        device.require_triton("")
