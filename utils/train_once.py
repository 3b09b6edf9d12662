"""Train a small model once: a content-keyed cache of what a training function returns.

Several pages use the same tiny trained model (part 5's target and drafts, part 4's
pre-trained and SFT arithmetic model), and ``make test`` executes all of them, plus the
labs' student editions. Training each model once per run, instead of once per page, is
what :func:`train_once` does: decorate a function that trains and returns a model (or a
tuple of models and plain values), and the first call stores its result under a key; a
later call with the same key, from any notebook, test or process, loads it.

The key is a SHA-256 of everything the result depends on:

- the function's module and name, and its arguments with defaults applied
  (numbers, strings, tuples, lists, dicts, dataclasses such as ``LlamaConfig``, tensors
  by their bytes; anything else is refused with ``TypeError`` rather than guessed);
- the source of **every module of the** :mod:`utils` **package**, so that a reader who edits
  the code that trains, or anything it calls, gets a model trained by the new code, never a
  stale one (an edit anywhere in ``utils`` retrains, which costs seconds);
- the versions of torch and numpy, torch's CPU kernel set (``AVX512``, ``AVX2``, ...) and its
  thread count: a CPU training's last digits depend on them, so a loaded model is bitwise
  the one the call would have trained on this machine, in this process's settings.

The function runs with torch's global generator seeded to 0 (its result cannot depend on
what the caller drew before) inside ``torch.random.fork_rng``, so a hit and a miss leave
the caller's random state exactly as it was.

Entries live in ``$BOOK_TRAIN_CACHE`` if set (``off`` turns the cache off), else in
``.cache/trained`` of the book's checkout (``make clean`` removes it). Two processes that
miss the same key at once train it once: the second waits on a file lock (POSIX) and loads.
Every edit of ``utils`` gives new keys, so the folder keeps the :data:`MAX_ENTRIES` most
recently used entries and deletes older ones when it stores a new one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch

__all__ = ["CACHE_VARIABLE", "cache_dir", "cache_key", "source_digest", "train_once"]

F = TypeVar("F", bound=Callable[..., Any])

CACHE_VARIABLE = "BOOK_TRAIN_CACHE"
"""Environment variable: the cache folder, or ``off`` to train on every call."""

PACKAGE_ROOT = Path(__file__).resolve().parent

MAX_ENTRIES = 64
"""Entries kept in the cache folder (the most recently used; a tiny model's entry is about a megabyte)."""


def cache_dir() -> Path | None:
    """The folder of cached results: ``$BOOK_TRAIN_CACHE``, else ``<checkout>/.cache/trained``; None when off."""
    value = os.environ.get(CACHE_VARIABLE, "")
    if value.lower() == "off":
        return None
    if value:
        return Path(value)
    return PACKAGE_ROOT.parent / ".cache" / "trained"


@functools.lru_cache(maxsize=None)
def _package_digest(root: Path, mtimes: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for relative, _, _ in mtimes:
        digest.update(relative.encode() + b"\0" + (root / relative).read_bytes() + b"\0")
    return digest.hexdigest()


def source_digest(root: Path = PACKAGE_ROOT) -> str:
    """SHA-256 of the path and bytes of every ``.py`` file under ``root`` (the :mod:`utils` package).

    Recomputed whenever a file's size or modification time changes, so an edit in a live
    kernel gives a new digest.
    """
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    stats = tuple((p.relative_to(root).as_posix(), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    return _package_digest(root, stats)


def _fingerprint(value: Any, where: str) -> Any:
    """A JSON-like, deterministic description of an argument; ``TypeError`` for types it cannot describe."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, [_fingerprint(v, f"{where}[{i}]") for i, v in enumerate(value)])
    if isinstance(value, dict):
        return ("dict", [(_fingerprint(k, where), _fingerprint(v, f"{where}[{k!r}]")) for k, v in
                         sorted(value.items(), key=lambda item: repr(item[0]))])
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        return (f"{cls.__module__}.{cls.__qualname__}",
                [(f.name, _fingerprint(getattr(value, f.name), f"{where}.{f.name}")) for f in dataclasses.fields(value)])
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        return ("tensor", str(data.dtype), list(data.shape),
                hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest())
    raise TypeError(f"train_once: argument {where} is a {type(value).__name__}, which the cache cannot key; "
                    "pass numbers, strings, tuples, lists, dicts, dataclasses or tensors")


def _environment() -> dict[str, Any]:
    import numpy

    return {"python": sys.version_info[:2], "torch": torch.__version__, "numpy": numpy.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}


def cache_key(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """The hex SHA-256 under which ``fn(*args, **kwargs)``'s result is cached (see the module docstring)."""
    target = inspect.unwrap(fn)
    bound = inspect.signature(target).bind(*args, **kwargs)
    bound.apply_defaults()
    description = repr((f"{target.__module__}.{target.__qualname__}",
                        [(name, _fingerprint(value, name)) for name, value in bound.arguments.items()],
                        sorted(_environment().items()), source_digest()))
    return hashlib.sha256(description.encode()).hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (POSIX ``flock``); no lock where ``fcntl`` is missing (Windows)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _prune(folder: Path) -> None:
    """Delete all but the :data:`MAX_ENTRIES` most recently used entries (and their lock files) of ``folder``."""
    keep = MAX_ENTRIES
    entries = sorted(folder.glob("*.pt"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for stale in entries[keep:]:
        for path in (stale, stale.with_suffix(".lock")):
            path.unlink(missing_ok=True)


def _run(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return fn(*args, **kwargs)


def train_once(fn: F) -> F:
    """Decorate a training function so that each distinct call trains once and is loaded afterwards.

    The result must be what ``torch.save`` can store (modules, tensors, tuples, lists, numbers).
    Every call returns a new object (loaded from disk), so a caller may train it further
    without touching the cache. ``wrapper.cache_key(*args, **kwargs)`` names the entry and
    ``wrapper.uncached`` is the plain function (run with the same seeding as a miss).
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        folder = cache_dir()
        if folder is None:
            return _run(fn, args, kwargs)
        key = cache_key(fn, *args, **kwargs)
        entry = folder / f"{fn.__module__}.{fn.__qualname__}-{key[:32]}.pt"
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:  # a read-only checkout: train every time
            return _run(fn, args, kwargs)
        with _locked(entry.with_suffix(".lock")):
            if entry.is_file():
                try:
                    result = torch.load(entry, weights_only=False)
                    os.utime(entry)  # most recently used: kept by _prune
                    return result
                except Exception:  # a damaged entry (an interrupted write on a system without atomic rename)
                    entry.unlink(missing_ok=True)
            result = _run(fn, args, kwargs)
            with tempfile.NamedTemporaryFile(dir=folder, suffix=".tmp", delete=False) as handle:
                torch.save(result, handle)
            os.replace(handle.name, entry)
        _prune(folder)
        return torch.load(entry, weights_only=False)

    wrapper.cache_key = functools.partial(cache_key, fn)  # type: ignore[attr-defined]
    wrapper.uncached = lambda *args, **kwargs: _run(fn, args, kwargs)  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
