"""Check the executed build's outputs against the stored ones, for every cell tagged ``nbval-check-output``.

    python .ci/check_outputs.py --config _build/config/execute.yml --build-dir _build NB [NB ...]

`make test` executes each notebook once, through the book's own path: ``make book EXECUTE=1``
(``.ci/execute_cache.py`` fills myst-nb's jupyter-cache, then the build renders from it). This
script then reads each notebook's executed copy back from that cache, by the same lookup the
build does, and compares the cells tagged ``nbval-check-output`` with the outputs stored in the
notebook, with nbval's own rules (``nbval --nbval-lax``): streams of one name joined, ``\\r`` and
``\\b`` applied, outputs compared per MIME type in order, images, metadata, execution counts and
widget model ids skipped, and the regexes of ``tests/nbval_sanitize.cfg`` applied to both sides.
So a checked output is compared without running the notebooks a second time, as ``make nbval``
would. A difference, or a notebook missing from the cache, is printed with the notebook, the
cell and both texts; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from collections import defaultdict
from pathlib import Path

CHECK_TAG = "nbval-check-output"
SKIP_COMPARE = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")
"""What nbval leaves out of a comparison (``IPyNbFile.skip_compare`` without ``--nbdime``)."""


def _execute_cache():
    """``.ci/execute_cache.py``, for the build's settings and its notebook reader."""
    if "execute_cache" not in sys.modules:
        spec = importlib.util.spec_from_file_location("execute_cache", Path(__file__).with_name("execute_cache.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["execute_cache"] = module
        spec.loader.exec_module(module)
    return sys.modules["execute_cache"]


def sanitize_patterns(path: Path) -> list[tuple[str, str]]:
    """The (regex, replacement) pairs of an nbval sanitize file, in order."""
    from nbval.plugin import get_sanitize_patterns

    return get_sanitize_patterns(path.read_text())


def _flatten(outputs, patterns: list[tuple[str, str]]) -> dict[str, list]:
    """nbval's comparison form: MIME type or stream name -> sanitized values, in output order."""
    from nbval.plugin import coalesce_streams, transform_streams_for_comparison

    def clean(value):
        if isinstance(value, str):
            for regex, replace in patterns:
                value = re.sub(regex, replace, value)
        return value

    flat: dict[str, list] = defaultdict(list)
    for output in transform_streams_for_comparison(coalesce_streams([o.copy() for o in outputs])):
        for key, value in output.items():
            if key in SKIP_COMPARE:
                continue
            if key == "data":
                for mime, data in value.items():
                    if mime not in SKIP_COMPARE:
                        flat[mime].append(clean(data))
            else:
                flat[key].append(clean(value))
    return flat


def compare_outputs(stored, executed, patterns: list[tuple[str, str]]) -> str | None:
    """None if the two output lists agree by nbval's rules, else what differs, for a reader."""
    want, got = _flatten(stored, patterns), _flatten(executed, patterns)
    if set(want) != set(got):
        return f"output kinds differ: stored {sorted(want)}, executed {sorted(got)}"
    for key in want:
        if want[key] != got[key]:
            return (f"{key} differs.\n--- stored:\n{''.join(map(str, want[key]))}\n"
                    f"+++ executed:\n{''.join(map(str, got[key]))}")
    return None


def check_notebook(path: Path, config_path: Path, build_dir: Path, patterns: list[tuple[str, str]]
                   ) -> tuple[list[str], int]:
    """The differences (one message each) between ``path``'s checked cells and its executed copy in the cache,
    and how many cells were compared."""
    from jupyter_cache import get_cache

    ec = _execute_cache()
    nb_config = ec.book_nb_config(config_path, build_dir)
    notebook, nb_config, _ = ec.read_notebook(path, nb_config)
    if ec.is_excluded(path, nb_config):
        return [], 0
    cache = get_cache(nb_config.execution_cache_path)
    try:
        record = cache.match_cache_notebook(notebook)
    except KeyError:
        return [f"{path}: not in the executed build's cache ({nb_config.execution_cache_path}); "
                "run `make book EXECUTE=1` first"], 0
    executed = cache.get_cache_bundle(record.pk).nb
    # jupyter-cache keeps the code cells only: pair the notebook's code cells with the cached ones, in order.
    code = [(i, cell) for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"]
    runs = [cell for cell in executed.cells if cell.cell_type == "code"]
    if len(code) != len(runs):
        return [f"{path}: {len(code)} code cells, but {len(runs)} in the cached copy; the cache is stale"], 0
    problems, compared = [], 0
    for (i, cell), run in zip(code, runs):
        tags = cell.metadata.get("tags", [])
        if CHECK_TAG not in tags or "skip-execution" in tags:
            continue
        if run.source != cell.source:
            problems.append(f"{path} cell {i}: the cached copy has another source; the cache is stale")
            continue
        compared += 1
        difference = compare_outputs(cell.outputs, run.outputs, patterns)
        if difference:
            problems.append(f"{path} cell {i}: {difference}")
    return problems, compared


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".ci/check_outputs.py", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, type=Path, help="the executed build's config (cache mode)")
    parser.add_argument("--build-dir", default=Path("_build"), type=Path, help="where the build keeps its cache")
    parser.add_argument("--sanitize", default=Path("tests/nbval_sanitize.cfg"), type=Path,
                        help="nbval's sanitize file (regex/replace pairs)")
    parser.add_argument("notebooks", nargs="+", type=Path)
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.notebooks if not p.is_file()]
    if missing:
        raise ValueError(f"no such notebook: {', '.join(missing)}")
    patterns = sanitize_patterns(args.sanitize)
    problems, cells = [], 0
    for path in args.notebooks:
        found, compared = check_notebook(path, args.config, args.build_dir, patterns)
        problems += found
        cells += compared
    for problem in problems:
        print(f"FAIL {problem}\n")
    print(f"checked outputs: {cells} cells of {len(args.notebooks)} notebooks compared with the executed build; "
          f"{len(problems)} difference(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
