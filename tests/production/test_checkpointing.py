"""Checkpoint, kill, resume: bitwise on the same ranks, to rounding across a reshard; the pieces one at a time."""

import pytest
import torch

from utils.dist import WorkerError
from utils.production import checkpointing as ck


def test_a_killed_run_resumes_exactly(tmp_path):
    """Rank 1 is SIGKILLed at step 6 of 8; the run resumes from step 3's checkpoint, on 4 ranks bitwise, and on
    2 ranks (resharded from 4) to fp32 rounding."""
    reference = ck.train(tmp_path / "reference", world_size=4, steps=8, every=0)
    with pytest.raises(WorkerError, match="rank 1 failed: process exited with code -9"):
        ck.train(tmp_path / "run", world_size=4, steps=8, every=4, kill_rank=1, kill_at=6)
    assert ck.latest_checkpoint(tmp_path / "run")[0] == 3
    same = ck.train(tmp_path / "run", world_size=4, steps=8, every=0, resume=True)
    assert same.first_step == 4 and sorted(same.losses) == [4, 5, 6, 7]
    assert ck.max_difference(reference.params, same.params) == 0.0
    assert all(same.losses[k] == reference.losses[k] for k in same.losses)
    fewer = ck.train(tmp_path / "run", world_size=2, steps=8, every=0, resume=True)
    assert 0 < ck.max_difference(reference.params, fewer.params) < 1e-5


def test_only_complete_checkpoints_are_resumed_from(tmp_path):
    (tmp_path / "step-3").mkdir()
    (tmp_path / "step-3" / ck.COMPLETE).write_text("3")
    (tmp_path / "step-7").mkdir()  # a save that died half-way: no marker
    assert ck.latest_checkpoint(tmp_path) == (3, tmp_path / "step-3")
    assert ck.latest_checkpoint(tmp_path / "nothing") is None


def test_the_data_loader_state_is_the_step():
    assert torch.equal(ck.batch_for_step(5), ck.batch_for_step(5))
    assert not torch.equal(ck.batch_for_step(5), ck.batch_for_step(6))
    assert ck.batch_for_step(0).shape == (ck.BATCH, ck.SEQ_LEN + 1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(world_size=3), "world_size must divide the batch of 8 sequences"),
    (dict(every=-1), "every must be an int >= 0"),
    (dict(kill_rank=1), "give both kill_rank and kill_at"),
    (dict(kill_rank=4, kill_at=2), r"kill_rank must be a rank in \[0, 4\)"),
])
def test_bad_input_is_refused(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ck.train(tmp_path, **kwargs)


def test_resuming_with_no_checkpoint_says_so(tmp_path):
    with pytest.raises(WorkerError, match="no complete checkpoint"):
        ck.train(tmp_path, world_size=2, steps=2, resume=True)
