"""utils.progress: a live bar when someone watches, one stable line when a notebook runs unattended."""

from __future__ import annotations

import pytest

from utils.progress import BATCH_VARIABLE, batch_execution, progress


def test_unattended_run_prints_one_line_after_the_loop(monkeypatch, capsys):
    monkeypatch.setenv(BATCH_VARIABLE, "1")
    seen = []
    for item in progress(range(5), "train"):
        seen.append(item)
        assert capsys.readouterr().out == ""  # nothing while the loop runs
    assert seen == [0, 1, 2, 3, 4]
    captured = capsys.readouterr()
    assert captured.out == "train: 5/5\n" and captured.err == ""


def test_unattended_run_of_an_iterable_without_a_length(monkeypatch, capsys):
    monkeypatch.setenv(BATCH_VARIABLE, "1")
    assert list(progress((i for i in range(3)), "seeds")) == [0, 1, 2]
    assert capsys.readouterr().out == "seeds: 3\n"


def test_a_loop_left_early_prints_nothing(monkeypatch, capsys):
    monkeypatch.setenv(BATCH_VARIABLE, "1")
    for item in progress(range(10), "train"):
        if item == 2:
            break
    assert capsys.readouterr().out == ""


def test_live_run_draws_a_tqdm_bar(monkeypatch, capsys):
    monkeypatch.delenv(BATCH_VARIABLE, raising=False)
    assert not batch_execution()
    assert list(progress(range(4), "live", mininterval=0)) == [0, 1, 2, 3]
    err = capsys.readouterr().err  # tqdm's text bar outside Jupyter
    assert "live" in err and "4/4" in err


@pytest.mark.parametrize("kwargs, message", [({"desc": ""}, "desc"), ({"desc": "x", "total": -1}, "total")])
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        list(progress(range(3), **kwargs))


def test_the_makefile_sets_the_variable_and_the_lab_target_unsets_it():
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert f"export {BATCH_VARIABLE} := 1" in makefile
    assert f"env -u {BATCH_VARIABLE} $(BIN)/jupyter lab" in makefile
