"""utils.dist.launch through its public seam: results, errors, crashes and hangs."""

import os
import time

import multiprocessing
import pytest
import torch
import torch.distributed as dist

from utils.dist import WorkerError, launch


def _all_reduce_rank(rank, world_size, offset):
    t = torch.tensor([float(rank + offset)])
    dist.all_reduce(t)
    return {"rank": rank, "env_rank": int(os.environ["RANK"]), "sum": t}


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
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
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="had not returned after 2 s") as info:
        launch(_deadlock, 2, timeout=2)
    assert "in _deadlock" in str(info.value), "the error should show where each rank hung"
    assert time.monotonic() - start < 10
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
