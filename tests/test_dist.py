"""utils.dist.launch through its public seam: results, errors, crashes and hangs."""

import os
import time

import multiprocessing
import pytest
import torch
import torch.distributed as dist

from utils.dist import NCCL_BACKEND, WorkerError, choose_backend, choose_start_method, launch, worker_threads

CUDA_PRESENT = torch.cuda.device_count() > 0  # fork is refused there; see choose_start_method


def _all_reduce_rank(rank, world_size, offset):
    t = torch.tensor([float(rank + offset)])
    dist.all_reduce(t)
    return {"rank": rank, "env_rank": int(os.environ["RANK"]), "sum": t}


@pytest.mark.parametrize("start_method", [
    pytest.param("fork", marks=pytest.mark.skipif(CUDA_PRESENT, reason="launch refuses fork where CUDA is present")),
    "spawn",
])
def test_results_come_back_in_rank_order(start_method):
    out = launch(_all_reduce_rank, 3, 1.0, start_method=start_method)
    assert [o["rank"] for o in out] == [0, 1, 2]
    assert [o["env_rank"] for o in out] == [0, 1, 2]
    for o in out:
        torch.testing.assert_close(o["sum"], torch.tensor([6.0]))  # (0+1) + (1+1) + (2+1)


def test_a_function_defined_at_run_time_works_with_spawn():
    namespace = {}
    exec("def local(rank, world_size):\n    return rank * 10\n", namespace)  # like a notebook cell
    assert launch(namespace["local"], 2, start_method="spawn") == [0, 10]


def _raise_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("bad shard on purpose")
    dist.barrier()


def test_a_raising_worker_names_its_rank_and_traceback():
    with pytest.raises(WorkerError) as info:
        launch(_raise_on_rank_one, 2, timeout=30)
    assert info.value.rank == 1
    assert "ValueError: bad shard on purpose" in str(info.value)
    assert "_raise_on_rank_one" in info.value.worker_traceback
    assert multiprocessing.active_children() == []


def _deadlock(rank, world_size):
    dist.recv(torch.zeros(1), src=1 - rank)  # both ranks wait for the other


def test_a_hang_becomes_a_timeout_and_leaves_no_process():
    # Spawned workers (any machine with CUDA) import torch afresh before they reach the deadlock. Forked ones
    # still form the gloo group first: 2 s was too short for that once, beside make test's other lanes (the
    # ranks' stacks were still in the parent's code), so 8 s; the test waits, it does not compute.
    seconds = 15 if CUDA_PRESENT else 8
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=f"had not returned after {seconds} s") as info:
        launch(_deadlock, 2, timeout=seconds)
    assert "in _deadlock" in str(info.value), "the error should show where each rank hung"
    assert time.monotonic() - start < seconds + 8
    assert multiprocessing.active_children() == []


def _crash(rank, world_size):
    if rank == 0:
        os._exit(7)
    time.sleep(60)


def test_a_crashed_worker_is_reported_with_its_exit_code():
    with pytest.raises(WorkerError, match="rank 0 failed: process exited with code 7"):
        launch(_crash, 2, timeout=30)
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("kwargs, match", [
    (dict(fn=42, world_size=2), "callable"),
    (dict(fn=_crash, world_size=0), "world_size"),
    (dict(fn=_crash, world_size=2, backend="mpi"), "backend"),
    (dict(fn=_crash, world_size=2, timeout=0), "timeout"),
    (dict(fn=_crash, world_size=2, start_method="forkserver"), "start_method"),
])
def test_bad_arguments_raise_value_error(kwargs, match):
    fn, world_size = kwargs.pop("fn"), kwargs.pop("world_size")
    with pytest.raises(ValueError, match=match):
        launch(fn, world_size, **kwargs)


# The decisions of launch, as pure functions of the machine's facts (no GPU needed to test them).

@pytest.mark.parametrize("world_size, gpu_count, nccl_available, backend, start_method", [
    (2, 0, False, "gloo", "fork"),          # a CPU-only machine: gloo, and fork keeps notebook functions working
    (2, 0, True, "gloo", "fork"),           # NCCL compiled in but no GPU
    (1, 1, True, NCCL_BACKEND, "spawn"),    # one GPU per rank: NCCL for CUDA tensors, gloo for CPU ones
    (2, 1, True, "gloo", "spawn"),          # too few GPUs for NCCL, but CUDA is present: never fork
    (4, 8, True, NCCL_BACKEND, "spawn"),
    (4, 8, False, "gloo", "spawn"),         # GPUs but a torch without NCCL
])
def test_backend_and_start_method_for_a_machine(world_size, gpu_count, nccl_available, backend, start_method):
    assert choose_backend(world_size, gpu_count, nccl_available) == backend
    assert choose_start_method(None, cuda_present=gpu_count > 0, fork_available=True) == start_method


def test_nccl_always_comes_with_gloo_for_cpu_tensors():
    assert NCCL_BACKEND == "cpu:gloo,cuda:nccl"
    assert choose_backend(2, 2, True, requested="nccl") == NCCL_BACKEND
    assert choose_backend(2, 2, True, requested=NCCL_BACKEND) == NCCL_BACKEND
    assert choose_backend(2, 8, True, requested="gloo") == "gloo"


def test_spawn_wherever_fork_is_missing_and_when_asked():
    assert choose_start_method(None, cuda_present=False, fork_available=False) == "spawn"
    assert choose_start_method("spawn", cuda_present=False, fork_available=True) == "spawn"
    assert choose_start_method("fork", cuda_present=False, fork_available=True) == "fork"


@pytest.mark.parametrize("call, match", [
    (lambda: choose_backend(4, 2, True, requested="nccl"), "one GPU per rank.*only 2 GPUs"),
    (lambda: choose_backend(1, 1, False, requested="nccl"), "no NCCL"),
    (lambda: choose_backend(2, 2, True, requested="mpi"), "backend must be"),
    (lambda: choose_backend(0, 2, True), "world_size"),
    (lambda: choose_backend(1, -1, True), "gpu_count"),
    (lambda: choose_start_method("fork", cuda_present=True, fork_available=True),
     "refused on a machine with a CUDA GPU.*Cannot re-initialize CUDA in forked subprocess"),
    (lambda: choose_start_method("fork", cuda_present=False, fork_available=False), "not available"),
    (lambda: choose_start_method("forkserver", cuda_present=False, fork_available=True), "start_method"),
])
def test_impossible_choices_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.skipif(CUDA_PRESENT, reason="on a GPU machine launch may pick NCCL")
def test_launch_uses_gloo_here():
    assert launch(lambda rank, world_size: dist.get_backend(), 2, start_method="spawn") == ["gloo", "gloo"]


def _threaded_op(rank, world_size):
    a = torch.randn(64, 3, 40, 40, dtype=torch.float64)
    return torch.get_num_threads(), float(torch.exp(a).sum())


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here")
def test_a_forked_worker_does_not_hang_after_the_parent_ran_parallel_ops():
    """GNU OpenMP is not fork-safe: a forked child that runs a multi-threaded op after the parent did can hang."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(1000, 1000)
        (x @ x).sum()
        torch.exp(torch.randn(64, 3, 40, 40, dtype=torch.float64))  # the parent's OpenMP pool is now live
        [(threads, _)] = launch(_threaded_op, 1, start_method="fork", timeout=30)
    finally:
        torch.set_num_threads(before)
    assert threads == 1


def test_worker_threads_share_the_cores_except_under_fork():
    assert worker_threads("fork", 1, cpu_count=16) == 1
    assert worker_threads("spawn", 2, cpu_count=16) == 8
    assert worker_threads("spawn", 4, cpu_count=2) == 1
