"""Run a function in several processes with ``torch.distributed`` set up.

:func:`launch` is the book's ``torchrun`` for notebooks: it starts
``world_size`` processes, initialises a process group in each, calls
``fn(rank, world_size, *args)`` and returns what each rank returned, in rank order.

The backend and the start method are chosen by the pure functions of
:mod:`utils.dist_policy`: gloo on a CPU, ``"cpu:gloo,cuda:nccl"``
(:data:`NCCL_BACKEND`) when every rank can have its own GPU; ``fork`` on a
CPU-only Linux machine (so functions defined in a notebook work), ``spawn``
wherever CUDA is present. Each NCCL rank calls ``torch.cuda.set_device`` and
passes ``device_id`` to ``init_process_group``, which binds the group to that
GPU and forms the NCCL communicator at once, not lazily at the first
collective (PyTorch docs of ``init_process_group``, ``device_id``).
:data:`NCCL_BACKEND`, :func:`choose_backend`, :func:`choose_start_method`,
:func:`default_backend` and :func:`default_start_method` are imported here
from :mod:`utils.dist_policy`, so ``utils.dist`` stays the one import for a
launcher's users (its tests and benchmarks import them from here).

It is built so that a lab can never freeze a notebook:

* a worker that raises makes :func:`launch` raise :class:`WorkerError`, naming
  the rank and carrying the worker's traceback text;
* a worker that dies without a word (a crash, ``os._exit``, a signal) is reported
  with its exit code;
* workers still running after ``timeout`` seconds (a deadlocked send/recv, a
  collective one rank never joined) are killed and :func:`launch` raises
  ``TimeoutError``.

The same worker functions run under ``torchrun`` with :func:`torchrun_main`,
which follows the same backend rule with one GPU per local rank.
"""

from __future__ import annotations

import datetime
import faulthandler
import multiprocessing as mp
import os
import pickle
import queue
import signal
import tempfile
import time
import traceback
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from utils.dist_policy import (  # noqa: F401  (default_backend, default_start_method: public here too)
    NCCL_BACKEND,
    choose_backend,
    choose_start_method,
    cuda_present,
    default_backend,
    default_start_method,
)
from utils.validate import check_positive, check_positive_int

_POLL_SECONDS = 0.05
_GRACE_SECONDS = 1.0  # after a first error, how long to wait for the others (to find the root cause)


class WorkerError(RuntimeError):
    """A worker process of :func:`launch` raised or died; ``rank`` and ``worker_traceback`` say where and why."""

    def __init__(self, rank: int, message: str, worker_traceback: str = "") -> None:
        self.rank = rank
        self.worker_traceback = worker_traceback
        text = f"rank {rank} failed: {message}"
        if worker_traceback:
            text += "\n\n--- traceback from rank %d ---\n%s" % (rank, worker_traceback.rstrip())
        super().__init__(text)


def _to_cpu(value: Any) -> Any:
    """Move tensors in (nested lists, tuples, dicts of) results to the CPU, so the parent never touches CUDA."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        moved = [_to_cpu(v) for v in value]
        return type(value)(moved) if not hasattr(value, "_fields") else type(value)(*moved)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _worker(
    payload: bytes | Callable[..., Any],
    rank: int,
    world_size: int,
    backend: str,
    store_path: str,
    timeout: float,
    results: Any,
    stack_file: str,
    threads: int,
) -> None:
    """Body of each worker process: set up the group, run the function, report back."""
    # On SIGUSR1 (sent by the parent at a timeout) write this process's stack, to say where it hung.
    stacks = open(stack_file, "w")  # noqa: SIM115  (lives as long as the process)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=False)
    try:
        if isinstance(payload, bytes):
            fn, args = pickle.loads(payload)
        else:
            fn, args = payload
        os.environ.update(
            RANK=str(rank), WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
        )
        device_id = None
        if backend == NCCL_BACKEND:
            torch.cuda.set_device(rank)  # before init: NCCL (and batch_isend_irecv) need the current device set
            device_id = torch.device("cuda", rank)
        torch.set_num_threads(threads)
        # Longer than launch's own timeout, so a hang is reported by the parent as a TimeoutError.
        group_timeout = datetime.timedelta(seconds=timeout + 60)
        store = dist.FileStore(store_path, world_size)
        store.set_timeout(group_timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=group_timeout,
                                device_id=device_id)
        value = fn(rank, world_size, *args)
        _wait_for_every_rank(store, "finished", rank, world_size)
        dist.destroy_process_group()
        results.put((rank, "ok", pickle.dumps(_to_cpu(value))))
    except BaseException as exc:  # report everything, including KeyboardInterrupt and SystemExit
        # The time of failure finds the root cause among ranks; no graceful teardown,
        # the parent stops every worker once it has read the error.
        failed_at = time.time()
        results.put((rank, "error", f"{type(exc).__name__}: {exc}", traceback.format_exc(), failed_at))


def _wait_for_every_rank(store: dist.Store, key: str, rank: int, world_size: int) -> None:
    """A barrier on the store: return once every rank has set ``key/<rank>``.

    Without it a rank whose function returns at once can tear its gloo
    connections down while a peer is still finishing ``connectFullMesh`` in
    ``init_process_group``; the peer then fails with "Connection closed by
    peer". That happened about once in 60 two-rank spawn launches on a busy
    2-core machine. A store barrier, unlike ``dist.barrier``, adds no collective
    that the worker function might not expect.
    """
    store.set(f"{key}/{rank}", b"1")
    store.wait([f"{key}/{r}" for r in range(world_size)])


def worker_threads(start_method: str, world_size: int, cpu_count: int | None = None) -> int:
    """Intra-op threads for each worker: 1 under fork, else the cores shared out (at least 1).

    A forked child inherits the parent's OpenMP thread pool in a broken state: once
    the parent has run a parallel op (a matmul in an earlier cell), a child that runs
    one with more than one thread can hang for good (GNU libgomp is not fork-safe;
    reproduced with ``launch(fn, 1)`` on 2 cores). With one thread PyTorch runs ops
    inline and never enters OpenMP. Spawned workers start clean and share the cores.
    """
    cores = os.cpu_count() if cpu_count is None else cpu_count
    return 1 if start_method == "fork" else max(1, (cores or 1) // world_size)


def _preload_for_fork() -> None:
    """Import, once in the parent, what every forked worker would otherwise import for itself.

    A torch optimizer (``Optimizer.add_param_group``) and FSDP2 import ``torch._dynamo`` on
    first use: 1 to 3 s of CPU in each rank of every launch. Imported before the fork, the
    workers inherit it and the parent pays once per kernel. (It starts no thread, so the fork
    stays safe.)
    """
    import torch._dynamo  # noqa: F401


def _stop(processes: Sequence[mp.process.BaseProcess]) -> None:
    """Terminate, then kill, every worker still alive, and reap them all."""
    processes = [p for p in processes if p.pid is not None]  # started ones only
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 3.0
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _hung_stacks(processes: Sequence[mp.process.BaseProcess], stack_files: Sequence[str],
                 ranks: Sequence[int]) -> str:
    """Ask hung workers for their Python stacks (SIGUSR1, see _worker) and return them as text."""
    for p in processes:
        if p.is_alive() and p.pid is not None:
            os.kill(p.pid, signal.SIGUSR1)
    time.sleep(0.5)
    parts = []
    for rank, path in zip(ranks, stack_files):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            text = ""
        parts.append(f"--- rank {rank} ---\n{text or '(no stack: the process did not answer)'}")
    return "\n".join(parts)


def _raise_root_cause(first: tuple, results: Any, processes: Sequence[mp.process.BaseProcess] = ()) -> None:
    """Raise a WorkerError for the earliest error among ``first`` and any that arrive soon after.

    When one rank raises, its peers usually fail a moment later with "connection
    closed by peer"; the earliest error is the one worth reading. A rank of
    ``processes`` that died without reporting (a nonzero exit code) comes first.
    """
    errors = [first]
    deadline = time.monotonic() + _GRACE_SECONDS
    while time.monotonic() < deadline:
        try:
            message = results.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            continue
        if message[1] == "error":
            errors.append(message)
    reported = {m[0] for m in errors}
    # A worker that reports an error returns normally (exit code 0); one that died without a word
    # (os._exit, a signal, a crash) is the likelier root cause than its peers' "connection closed".
    crashed = [(rank, p.exitcode) for rank, p in enumerate(processes)
               if rank not in reported and not p.is_alive() and p.exitcode not in (0, None)]
    if crashed:
        rank, code = crashed[0]
        others = sorted(reported)
        raise WorkerError(rank, f"process exited with code {code} without returning a result"
                          + (f"\n(ranks {others} failed after it)" if others else ""))
    rank, _, text, worker_traceback, _ = min(errors, key=lambda m: m[4])
    others = sorted(m[0] for m in errors if m[0] != rank)
    if others:
        text += f"\n(ranks {others} failed after it)"
    raise WorkerError(rank, text, worker_traceback)


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str | None = None,
    timeout: float = 60.0,
    start_method: str | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes; return the results in rank order.

    Each process has ``torch.distributed`` initialised (``backend`` is ``"gloo"``,
    ``"nccl"`` or None for :func:`default_backend`; "nccl" means :data:`NCCL_BACKEND`,
    with rank ``r`` on GPU ``r``, bound by ``device_id``) and the usual
    ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` variables set (the rendezvous
    goes through a ``FileStore`` in a temporary folder, so there is no ``MASTER_PORT``).
    Results are pickled back to the parent with tensors moved to the CPU.

    ``start_method`` is "fork", "spawn" or None for :func:`default_start_method`
    (fork is refused where CUDA is present).

    Raises :class:`WorkerError` if a worker raises or dies, ``TimeoutError`` if
    the workers have not all returned after ``timeout`` seconds; in both cases
    every worker is stopped before the error is raised.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    check_positive_int("world_size", world_size)
    check_positive("timeout (seconds)", timeout, finite=True)
    backend = choose_backend(world_size, torch.cuda.device_count(), dist.is_nccl_available(), backend)
    method = choose_start_method(start_method, cuda_present(), "fork" in mp.get_all_start_methods())
    ctx = mp.get_context(method)
    if method == "fork":
        _preload_for_fork()
        payload: bytes | tuple = (fn, args)
    else:
        import cloudpickle

        payload = cloudpickle.dumps((fn, args))

    # Rendezvous through a file, not a TCP store hosted by the parent: no port to pick, and no
    # server thread in the parent at fork time (a forked child can inherit that thread's locks held,
    # and hang; about 1 launch in 150 of 4 ranks did, before this).
    results = ctx.Queue()
    scratch = tempfile.TemporaryDirectory(prefix="launch-")
    store_path = os.path.join(scratch.name, "store")
    stack_files = [os.path.join(scratch.name, f"stack-rank{rank}.txt") for rank in range(world_size)]
    processes = [
        ctx.Process(target=_worker, daemon=True, name=f"launch-rank-{rank}",
                    args=(payload, rank, world_size, backend, store_path, timeout, results, stack_files[rank],
                          worker_threads(method, world_size)))
        for rank in range(world_size)
    ]
    outputs: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        for p in processes:
            p.start()
        while len(outputs) < world_size:
            try:
                message = results.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                message = None
            if message is not None:
                if message[1] == "error":
                    _raise_root_cause(message, results, processes)
                outputs[message[0]] = pickle.loads(message[2])
                continue
            for rank, p in enumerate(processes):
                if rank not in outputs and not p.is_alive():
                    # A last look: the result may have been queued just before the exit.
                    try:
                        late = results.get(timeout=0.5)
                    except queue.Empty:
                        raise WorkerError(rank, f"process exited with code {p.exitcode} "
                                                "without returning a result") from None
                    if late[1] == "error":
                        _raise_root_cause(late, results, processes)
                    outputs[late[0]] = pickle.loads(late[2])
                    break
            if time.monotonic() > deadline:
                missing = sorted(set(range(world_size)) - set(outputs))
                raise TimeoutError(
                    f"launch: ranks {missing} of {world_size} had not returned after {timeout:g} s "
                    "(a deadlock, such as a send with no matching recv, or a collective that "
                    "not every rank joined?); all workers were stopped. Where they were:\n"
                    + _hung_stacks([processes[r] for r in missing], [stack_files[r] for r in missing], missing)
                )
    finally:
        _stop(processes)
        scratch.cleanup()
        results.close()
    return [outputs[rank] for rank in range(world_size)]


def torchrun_main(fn: Callable[..., Any], *args: Any, backend: str | None = None) -> Any:
    """Run ``fn(rank, world_size, *args)`` in a process started by ``torchrun``; return its result.

    ``torchrun --nproc-per-node=4 -m some.module`` sets ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and the rendezvous variables; this initialises
    the process group from them with :func:`choose_backend` (``backend`` is "gloo",
    "nccl" or None): :data:`NCCL_BACKEND` when this node has a GPU per local rank,
    each rank on GPU ``LOCAL_RANK`` and bound to it by ``device_id``; gloo otherwise.
    Then it calls ``fn`` and tears the group down. Worker functions written for
    :func:`launch` run unchanged.
    """
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise ValueError("torchrun_main expects RANK and WORLD_SIZE in the environment; start it with torchrun")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    backend = choose_backend(local_world_size, torch.cuda.device_count(), dist.is_nccl_available(), backend)
    device_id = None
    if backend == NCCL_BACKEND:
        torch.cuda.set_device(local_rank)
        device_id = torch.device("cuda", local_rank)
    dist.init_process_group(backend, device_id=device_id)
    try:
        return fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
