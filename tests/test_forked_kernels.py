"""utils.forked_kernels: make test's kernels, forked from a warm process, behave as freshly started ones."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, DeadKernelError

from utils.forked_kernels import _ServerHandle

ROOT = Path(__file__).resolve().parent.parent
SPEC_DIR = ROOT / ".ci" / "jupyter"

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="make test forks kernels on Linux only (utils.forked_kernels)")


@pytest.fixture
def forked(monkeypatch):
    """Kernels started by name "python3" come from the fork server, as in make test."""
    monkeypatch.setenv("JUPYTER_PATH", str(SPEC_DIR))
    monkeypatch.setenv("BOOK_TEST_MARK", "seen by the kernel")
    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.metadata["kernel_provisioner"]["provisioner_name"] == "book-forked-kernel"


def _run(cells: list[str], tmp_path: Path, timeout: int = 60) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    return nb


def _text(nb: nbformat.NotebookNode) -> list[str]:
    """Each cell's printed text (the cells that print), its stream messages joined: a busy kernel may send one
    print's text in several messages (a fresh-clone run once got ``'child\\n'`` and ``'\\n'`` apart)."""
    texts = ["".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream") for cell in nb.cells]
    return [t for t, cell in zip(texts, nb.cells) if any(o.output_type == "stream" for o in cell.outputs)]


def test_a_forked_kernel_runs_where_and_with_what_it_was_asked(forked, tmp_path):
    nb = _run(["import os, sys\nprint(os.getcwd()); print(os.environ['BOOK_TEST_MARK'])",
               "import torch, matplotlib\nprint(sys.modules['torch'] is torch, matplotlib.get_backend())",
               "import matplotlib.pyplot as plt\nplt.plot([1, 2])",  # drawn by the inline backend: an image
               "import subprocess\nprint(subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout)",
               "print(os.getpid() != os.getppid() and os.getpgid(0) == os.getpid())"], tmp_path)
    assert _text(nb) == [f"{tmp_path}\nseen by the kernel\n", "True module://matplotlib_inline.backend_inline\n",
                         "child\n\n", "True\n"]
    assert [o.output_type for o in nb.cells[2].outputs] == ["execute_result", "display_data"]
    assert "image/png" in nb.cells[2].outputs[1].data


def test_a_kernel_environment_chooses_matplotlibs_backend_and_triton_mode(forked, monkeypatch, tmp_path):
    monkeypatch.setenv("MPLBACKEND", "agg")  # another environment: another server, which imports with it
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the server imports triton without it
    nb = _run(["import matplotlib, os\nprint(matplotlib.get_backend())",
               "os.environ['TRITON_INTERPRET'] = '1'\nimport triton, triton.language as tl\n"
               "@triton.jit\ndef k(x):\n    pass\nprint(type(k).__name__, triton.knobs.runtime.interpret)"], tmp_path)
    assert _text(nb) == ["agg\n", "InterpretedFunction True\n"]  # set after the fork, obeyed


def test_kernels_talk_over_unix_sockets_that_are_removed_afterwards(forked, tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('over ipc')")])
    client = NotebookClient(nb, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    with client.setup_kernel():
        info, connection_file = client.km.get_connection_info(), client.km.connection_file
        assert info["transport"] == "ipc" and Path(f"{info['ip']}-{info['shell_port']}").is_socket()
        client.execute_cell(nb.cells[0], 0)
    assert _text(nb) == ["over ipc\n"]
    assert not list(Path(info["ip"]).parent.glob(Path(info["ip"]).name + "-*"))
    assert not Path(connection_file).exists()


def test_two_kernels_are_separate_processes_with_separate_state(forked, tmp_path):
    first = _run(["import os\nx = 1\nprint(os.getpid())"], tmp_path)
    second = _run(["import os\nprint(os.getpid(), 'x' in globals())"], tmp_path)
    assert _text(first)[0].split()[0] != _text(second)[0].split()[0]
    assert _text(second)[0].split()[1] == "False"


def test_errors_a_dead_kernel_and_an_interrupt_surface_as_usual(forked, tmp_path):
    with pytest.raises(CellExecutionError, match="ZeroDivisionError"):
        _run(["1 / 0"], tmp_path)
    with pytest.raises(DeadKernelError):
        _run(["import os\nos._exit(3)", "print('never')"], tmp_path)
    # a cell past its timeout: nbclient interrupts the kernel (SIGINT to its process group), then fails
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time\ntime.sleep(60)")])
    client = NotebookClient(nb, timeout=2, kernel_name="python3", interrupt_on_timeout=True,
                            resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(CellExecutionError, match="KeyboardInterrupt"):
        client.execute()


def test_the_kernel_spec_is_ipykernels_own_plus_the_provisioner():
    ours = json.loads((SPEC_DIR / "kernels" / "python3" / "kernel.json").read_text())
    default = KernelSpecManager(kernel_dirs=[str(Path(sys.prefix) / "share" / "jupyter" / "kernels")]).get_kernel_spec("python3")
    assert ours["argv"][1:] == default.argv[1:] and ours["language"] == default.language
    metadata = dict(ours["metadata"])
    assert metadata.pop("kernel_provisioner") == {"provisioner_name": "book-forked-kernel"}
    assert metadata == default.metadata, "keep .ci/jupyter's kernel spec in step with ipykernel's"


def test_a_kernel_whose_server_dies_is_reported_dead_not_waited_for(forked, tmp_path):
    with pytest.raises(DeadKernelError):
        _run(["import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(120)"], tmp_path, timeout=60)
    dead = {server.folder for server in _ServerHandle._servers.values()}
    assert _text(_run(["print('a new server')"], tmp_path)) == ["a new server\n"]
    assert not any(folder.exists() for folder in dead - {s.folder for s in _ServerHandle._servers.values()})


def test_a_server_whose_client_is_gone_ends_and_removes_its_folder():
    server = _ServerHandle(dict(os.environ))
    assert (server.folder / "server.sock").exists()
    server.process.stdin.close()  # what the client's exit does
    assert server.process.wait(timeout=30) == 0
    assert not server.folder.exists()
