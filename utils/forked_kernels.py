"""Jupyter kernels forked from a warm process, so that `make test` pays for ``import torch`` once, not per notebook.

Every kernel that ``make test`` starts (65 notebooks, the 26 labs' student editions, a few tests)
is a fresh Python process, and each spends about 1.5 s of CPU importing torch, NumPy and ipykernel
before its first cell runs: about a sixth of all the notebooks' CPU on a 2-core machine. Here
one *fork server* per client process imports them once, and each kernel is a ``fork()`` of it:

- :class:`ForkProvisioner` is a jupyter_client *kernel provisioner* (the documented way to change
  how a kernel process is started). Its ``launch_kernel`` asks the fork server for a kernel
  instead of running the kernel spec's command; everything else (connection file, ports, signals,
  restarts, shutdown) is jupyter_client's :class:`LocalProvisioner`. It is registered as the entry
  point ``book-forked-kernel`` (``pyproject.toml``) and chosen by the kernel spec
  ``.ci/jupyter/kernels/python3/kernel.json``, which ``make test`` puts first on ``JUPYTER_PATH``.
  A reader's JupyterLab, ``make book`` and ``make nbval`` start kernels the usual way.
- The server (``python -m utils.forked_kernels --serve SOCKET``) imports :data:`PRELOAD`, then
  forks one child per request. The child makes itself a session leader (so that signals to the
  kernel's process group work as usual), takes the requested working directory and environment,
  restores default signal handling, and runs the kernel spec's module (``ipykernel_launcher``)
  as ``python -m`` would. The server reaps its children and records each exit status in a file
  that the provisioner polls; it ends, and ends its kernels, when its client closes its stdin.

What a forked kernel shares with its siblings, unlike fresh processes: the modules in
:data:`PRELOAD` (imported with the same environment as the kernels get), and the state they
seeded at import: Python's string-hash seed and the global ``random``/NumPy generators, so
unseeded draws repeat from kernel to kernel. The book seeds every draw whose result it prints.
matplotlib reads its backend at import, so the server imports it with ``MPLBACKEND`` as the
kernel will have it: the kernel's own value, else ipykernel's inline backend (which ipykernel
sets when the variable is unset, :data:`INLINE_BACKEND`). The backend module itself is not
preloaded: it hooks into the kernel's shell when first imported, which only the kernel has.
triton reads its settings (``TRITON_INTERPRET``) from the environment when a kernel is
decorated, not at import, so a notebook that sets them after the fork is still obeyed.
Linux only: ``make test`` uses it there; on macOS (where forking after the Accelerate framework is
loaded is unsafe) and Windows it keeps the default kernel spec.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from jupyter_client.provisioning.local_provisioner import LocalProvisioner

# Imported once by the server: the bulk of a kernel's start (torch alone is about 1 s of CPU).
# What every kernel of the book imports first (about 2.2 s of CPU together, 0.7 s of it matplotlib and triton).
PRELOAD = ("numpy", "torch", "triton", "matplotlib.pyplot", "ipykernel.kernelapp")
# ipykernel sets MPLBACKEND to this when the kernel's environment leaves it unset (ipykernel.kernelapp).
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
# How long the provisioner waits for the server to be ready (it imports PRELOAD first).
SERVER_START_TIMEOUT = 120.0


class ForkedKernel:
    """The forked kernel as jupyter_client's provisioner sees a ``Popen``: ``pid``, ``poll``, ``wait``, signals."""

    stdin = stdout = stderr = None

    def __init__(self, pid: int, exit_file: Path) -> None:
        self.pid = pid
        self._exit_file = exit_file
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit status the server recorded; -9 if the kernel is gone unrecorded (its server was killed)."""
        if self.returncode is None:
            try:
                os.kill(self.pid, 0)
                alive = True  # or a zombie the server has not reaped yet
            except ProcessLookupError:
                alive = False
            if self._exit_file.is_file():  # looked at after the pid: a reap in between is seen
                self.returncode = int(self._exit_file.read_text())  # renamed into place whole
            elif not alive:
                self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked kernel {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class _ServerHandle:
    """The client's side of one fork server: started on first use, one per client process and kernel environment."""

    _servers: dict[tuple, _ServerHandle] = {}

    def __init__(self, env: dict[str, str]) -> None:
        self._owner = os.getpid()
        self.folder = Path(tempfile.mkdtemp(prefix="book-forked-kernels-"))
        self.socket_path = self.folder / "server.sock"
        self.process = subprocess.Popen([sys.executable, "-m", "utils.forked_kernels", "--serve", str(self.socket_path)],
                                        stdin=subprocess.PIPE, env=env)
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while not (self.folder / "ready").is_file():
            if self.process.poll() is not None:
                raise RuntimeError(f"the kernel fork server exited with status {self.process.returncode} "
                                   "before it was ready (its error is above)")
            if time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"the kernel fork server was not ready after {SERVER_START_TIMEOUT:.0f} s")
            time.sleep(0.02)

    @classmethod
    def get(cls, env: dict[str, str]) -> _ServerHandle:
        """The server for kernels with environment ``env``: the preloaded modules read it when imported."""
        key = tuple(sorted((k, v) for k, v in env.items() if not k.startswith("JPY_")))
        server = cls._servers.get(key)
        if server is None or server.process.poll() is not None or server.pid_changed():
            if server is not None and not server.pid_changed():
                shutil.rmtree(server.folder, ignore_errors=True)  # a server killed outright left it
            server = cls._servers[key] = cls(dict(key))
        return server

    def pid_changed(self) -> bool:
        """True in a process forked from the one that started this server: it starts its own."""
        return self._owner != os.getpid()

    def fork(self, argv: list[str], env: dict[str, str], cwd: str) -> ForkedKernel:
        request = json.dumps({"argv": argv, "env": env, "cwd": cwd, "client_pid": os.getpid()}).encode() + b"\n"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(str(self.socket_path))
            connection.sendall(request)
            reply = json.loads(connection.makefile("rb").readline())
        if "error" in reply:
            raise RuntimeError(f"the kernel fork server could not start a kernel: {reply['error']}")
        pid = int(reply["pid"])
        return ForkedKernel(pid, self.folder / f"{pid}.exit")


class ForkProvisioner(LocalProvisioner):
    """jupyter_client's local provisioner, except that the kernel process is forked from a warm server.

    Its kernels talk to their client over Unix sockets (ZeroMQ's ``ipc`` transport), not TCP. On
    TCP the client picks five free ports and the kernel binds them a moment later; when many
    kernels and ``torch.distributed`` stores start at once (``make test``), another process can
    take a port in between and the kernel dies with "Address already in use". Socket files named
    after the kernel's own connection file cannot be taken.
    """

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        km = self.parent
        if km is not None and km.transport == "tcp":
            if not km.connection_file:
                km.connection_file = os.path.join(tempfile.gettempdir(), f"book-kernel-{uuid.uuid4()}.json")
            km.transport = "ipc"
            km.ip = os.path.splitext(km.connection_file)[0] + "-ipc"  # the sockets are <ip>-1 ... <ip>-5
            km.cache_ports = False  # no TCP ports to reserve
        return await super().pre_launch(**kwargs)

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        if len(cmd) < 3 or cmd[1] != "-m":
            raise ValueError(f"a forked kernel runs a module (python -m MODULE ...); the kernel spec gives {cmd}")
        env = dict(kwargs.get("env") or os.environ)
        cwd = str(kwargs.get("cwd") or os.getcwd())
        self.process = _ServerHandle.get(env).fork(cmd, env, cwd)
        self.pid = self.pgid = self.process.pid  # the child calls setsid(): its group is its pid
        self.cwd = cwd
        return self.connection_info


def _run_kernel(request: dict) -> None:
    """In the forked child: become the kernel process the request describes. Never returns."""
    code = 1
    try:
        os.setsid()
        for signum in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # JPY_PARENT_PID names the client, as jupyter_client's launcher sets it. The kernel watches its
        # real parent, the server (which ends with the client): ipykernel read JPY_PARENT_PID when the
        # server imported it, so that is said on the kernel's command line.
        os.environ["JPY_PARENT_PID"] = str(request["client_pid"])
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        import runpy

        argv = request["argv"]
        sys.argv = [argv[2], *argv[3:], f"--IPKernelApp.parent_handle={os.getppid()}"]
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 (the child must exit whatever happened; the trace goes to stderr)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(socket_path: Path) -> None:
    """The fork server: import :data:`PRELOAD`, then fork a kernel per request until stdin closes.

    When it ends it kills the kernels still running and removes its folder (socket, exit files).
    """
    import importlib

    os.environ.setdefault("MPLBACKEND", INLINE_BACKEND)  # what the kernel's matplotlib will read
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # absent here (or hidden, as .ci/run_without_triton.py hides triton): the kernel's
            pass             # own import then fails the same way, as in a fresh kernel
    folder = socket_path.parent
    children: set[int] = set()

    def reap(*_: object) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            children.discard(pid)
            code = os.waitstatus_to_exitcode(status)
            partial = folder / f"{pid}.exit.part"
            partial.write_text(str(code))
            partial.rename(folder / f"{pid}.exit")

    signal.signal(signal.SIGCHLD, reap)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the client, which ends the kernels
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path))
    listener.listen(16)
    (folder / "ready").write_text(str(os.getpid()))
    try:
        while True:
            readable, _, _ = select.select([listener, sys.stdin], [], [])
            if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1024):
                return  # the client is gone
            if listener not in readable:
                continue
            connection, _ = listener.accept()
            with connection:
                try:
                    request = json.loads(connection.makefile("rb").readline())
                    pid = os.fork()
                except Exception as error:  # noqa: BLE001 (reported to the client, which raises)
                    connection.sendall(json.dumps({"error": repr(error)}).encode() + b"\n")
                    continue
                if pid == 0:
                    listener.close()
                    connection.close()
                    _run_kernel(request)
                children.add(pid)
                connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    finally:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # no more exit files: the folder goes next
        for pid in list(children):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--serve":
        raise SystemExit("usage: python -m utils.forked_kernels --serve SOCKET_PATH")
    serve(Path(sys.argv[2]))
