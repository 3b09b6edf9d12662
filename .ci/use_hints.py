"""Make a lab's checks give hints: ``python .ci/use_hints.py NB [NB ...]`` (source only, outputs untouched).

In every code cell after the lab's first solution block (its checks), each call
``torch.testing.assert_close(...)`` becomes ``hints.assert_close(..., lab="<slug>")``
(:mod:`utils.hints`), and the lab's first code cell gains ``from utils import hints``.
``hints.assert_close`` calls ``torch.testing.assert_close`` and passes exactly
when it does, so a passing check prints what it printed before and the stored
outputs stay valid; a failing one says which element differs, by how much, and
the usual cause in this lab. Idempotent: a rewritten call is left alone.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from utils.hints import MISTAKES  # noqa: E402
from utils.student_edition import exercises  # noqa: E402

LAB_SLUGS = {  # notebook stem -> key of utils.hints.MISTAKES
    "02-fused-softmax": "fused-softmax",
    "03-tiled-matmul": "tiled-matmul",
    "01-ring-all-reduce": "ring-all-reduce",
    "02-ddp-from-scratch": "ddp",
    "03-zero-and-fsdp": "zero",
    "04-tensor-parallel-mlp": "tensor-parallel",
    "05-pipeline-schedules": "pipeline",
    "06-activation-checkpointing": "activation-checkpointing",
    "07-loss-scaling": "loss-scaling",
    "01-rmsnorm-swiglu-rope-in-triton": "rmsnorm-swiglu-rope",
    "02-gqa-decoding-with-a-kv-cache": "gqa-decoding",
    "03-a-paged-kv-cache": "paged-kv-cache",
    "04-flash-attention": "flash-attention",
    "01-bellman-backups-on-tensors": "bellman-backups",
    "02-q-learning-and-reinforce": "q-learning-and-reinforce",
    "03-post-training-1-pretrain-and-sft": "post-training-lora",
    "04-post-training-2-reward-and-grpo": "post-training-grpo",
    "05-post-training-3-dpo": "post-training-dpo",
}
TARGET = "torch.testing.assert_close"


def _offset(lines: list[str], lineno: int, col: int) -> int:
    """Character offset of (1-based line, 0-based UTF-8 byte column) in the joined source."""
    line = lines[lineno - 1]
    return sum(len(x) for x in lines[:lineno - 1]) + len(line.encode()[:col].decode())


def rewrite_cell(source: str, slug: str | None) -> str:
    """``source`` with each ``torch.testing.assert_close(...)`` call turned into ``hints.assert_close(..., lab=slug)``."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == TARGET]
    edits = []  # (start, end, replacement), applied from the end backwards
    for call in calls:
        func_start = _offset(lines, call.func.lineno, call.func.col_offset)
        func_end = _offset(lines, call.func.end_lineno, call.func.end_col_offset)
        edits.append((func_start, func_end, "hints.assert_close"))
        if slug:
            close = _offset(lines, call.end_lineno, call.end_col_offset) - 1  # the call's ")"
            body = source[func_end:close].rstrip()
            edits.append((close, close, ("" if body.endswith(",") else ", ") + f'lab="{slug}"'))
    shift = len(TARGET) - len("hints.assert_close")
    continued = {line for call in calls for line in range(call.lineno, call.end_lineno)}  # 0-based: lines after
    for start, end, text in sorted(edits, reverse=True):
        source = source[:start] + text + source[end:]
    lines = source.splitlines(keepends=True)
    for i in sorted(continued):  # keep continuation lines aligned with the shorter name
        if lines[i].startswith(" " * (shift + 1)):
            lines[i] = lines[i][shift:]
    return "".join(lines)


def add_import(source: str) -> str:
    """``from utils import hints`` after the first ``from utils import`` line (or after ``import utils``)."""
    if "from utils import hints" in source:
        return source
    lines = source.split("\n")
    anchor = next((i for i, ln in enumerate(lines) if ln.startswith("from utils import")), None)
    if anchor is None:
        anchor = next(i for i, ln in enumerate(lines) if ln.startswith("import utils"))
    return "\n".join(lines[:anchor + 1] + ["from utils import hints"] + lines[anchor + 1:])


def _set_source(cell: dict, text: str) -> None:
    cell["source"] = text.splitlines(keepends=True) if isinstance(cell["source"], list) else text


def use_hints(path: Path) -> int:
    """Rewrite one lab in place; return the number of calls rewritten."""
    nb = json.loads(path.read_text())
    slug = LAB_SLUGS.get(path.stem)
    if slug is not None and slug not in MISTAKES:
        raise ValueError(f"{path}: slug {slug!r} has no table in utils.hints.MISTAKES")
    blocks = exercises(nb)
    if not blocks:
        return 0
    solution = {i for e in blocks for i in e.solution}
    count = 0
    for i, cell in enumerate(nb["cells"]):
        if i <= blocks[0].end or i in solution or cell["cell_type"] != "code":
            continue
        text = "".join(cell["source"])
        if TARGET in text:
            count += text.count(TARGET)
            _set_source(cell, rewrite_cell(text, slug))
    if count:
        first = next(c for c in nb["cells"] if c["cell_type"] == "code")
        _set_source(first, add_import("".join(first["source"])))
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return count


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(f"{name}: {use_hints(Path(name))} checks rewritten")
