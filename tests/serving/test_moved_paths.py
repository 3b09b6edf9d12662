"""The second edition's flat module paths under utils.serving still import, as the regrouped modules themselves."""

import importlib
import pathlib

import pytest

import utils.serving as serving


def test_every_moved_name_is_the_regrouped_module() -> None:
    for old, cluster in serving.MOVED.items():
        new = importlib.import_module(f"utils.serving.{cluster}.{old}")
        assert importlib.import_module(f"utils.serving.{old}") is new
        assert getattr(serving, old) is new
        assert new.__name__ == f"utils.serving.{cluster}.{old}"
        assert new.__spec__.name == new.__name__


def test_moved_names_the_cluster_that_holds_each_module() -> None:
    """Modules added since (the third edition's) have no flat path and need none; no cluster shadows a module."""
    root = pathlib.Path(serving.__file__).parent
    on_disk = {p.stem: p.parent.name for p in root.glob("*/*.py") if p.stem != "__init__"}
    assert {old: on_disk.get(old) for old in serving.MOVED} == serving.MOVED
    assert [p.name for p in root.glob("*.py")] == ["__init__.py"], "every module lives in a cluster"
    assert not set(serving.MOVED) & {p.name for p in root.iterdir() if p.is_dir()}, "a cluster may not share a module's name"


def test_old_from_import_and_patching_reach_the_same_function(monkeypatch: pytest.MonkeyPatch) -> None:
    from utils.serving.engine import Engine
    from utils.serving.runtime.engine import Engine as New
    assert Engine is New
    from utils.serving.speculation import speculative
    sentinel = object()
    monkeypatch.setattr("utils.serving.speculative.accept_draft", sentinel)
    assert speculative.accept_draft is sentinel


def test_unknown_names_still_fail() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("utils.serving.no_such_module")
