""".ci/stage.py and .ci/timings.py: make test's stage breakdown and `make slowest` (reports, never fails)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / ".ci" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stage, timings = _load("stage"), _load("timings")

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_fast" time="0.5"/>
<testcase classname="tests.test_b" name="test_slow[x]" time="12.25"/>
</testsuite></testsuites>"""


def test_a_stage_logs_its_time_and_passes_its_exit_status_on(tmp_path, capsys):
    log = tmp_path / "t" / "stages.tsv"
    assert stage.main(["--log", str(log), "unit", "--", sys.executable, "-c", "pass"]) == 0
    assert stage.main(["--log", str(log), "broken", "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    rows = timings.read_stages(log.parent)
    assert [(row.name, row.status) for row in rows] == [("unit", 0), ("broken", 3)]
    assert all(row.seconds >= 0 and row.end - row.start == pytest.approx(row.seconds, abs=0.2) for row in rows)
    assert rows[0].start <= rows[1].start
    assert "stage broken:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        stage.main(["--log", str(log), "nothing", "--"])


def test_a_stage_beside_others_prints_its_output_in_one_piece_when_it_ends(tmp_path, capsys):
    log, output = tmp_path / "stages.tsv", tmp_path / "logs" / "unit.log"
    code = "import sys; print('first line'); print('to stderr', file=sys.stderr); sys.exit(2)"
    assert stage.main(["--log", str(log), "--output", str(output), "unit", "--", sys.executable, "-c", code]) == 2
    assert output.read_text().splitlines() == ["first line", "to stderr"]
    out = capsys.readouterr().out
    # a loaded machine can take a second or more to start Python: the stage's seconds are not checked
    end = re.search(r"stage unit: \d+ s \(failed, exit status 2\)", out)
    assert end and out.index("runs beside the others") < out.index("first line") < out.index("to stderr") < end.start()


def test_stages_side_by_side_count_once_in_the_total(tmp_path, capsys):
    (tmp_path / "stages.tsv").write_text("setup\t80.0\t0\t1000.0\t1080.0\n"
                                        "unit\t300.0\t1\t1080.0\t1380.0\n"
                                        "execute\t400.0\t0\t1080.0\t1480.0\n")
    assert timings.wall_seconds(timings.read_stages(tmp_path)) == 480.0
    assert timings.main(["--dir", str(tmp_path), "--stages-only"]) == 0
    out = capsys.readouterr().out
    assert "total (wall)" in out and "8 min  0.0 s" in out  # 1480 - 1000, not 80 + 300 + 400
    assert "from 1 min 20.0 s" in out and "(failed, exit status 1)" in out


def test_the_report_splits_execution_from_rendering_and_lists_the_slowest(tmp_path, capsys):
    (tmp_path / "stages.tsv").write_text("setup\t80.0\t0\nexecute\t400.0\t0\nbrowser\t60.5\t0\n")
    (tmp_path / "notebooks.json").write_text(json.dumps({"jobs": 2, "wall_seconds": 340.0, "notebooks": [
        {"path": "labs/slow.ipynb", "status": "executed", "seconds": 30.0},
        {"path": "chapters/fast.ipynb", "status": "executed", "seconds": 5.0}]}))
    (tmp_path / "unit.xml").write_text(JUNIT)
    assert timings.main(["--dir", str(tmp_path), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "execute" in out and "2 notebooks, 2 at a time: 35.0 s of notebook time" in out
    assert "total" in out and "9 min" in out  # 80 + 400 + 60.5 s
    assert "labs/slow.ipynb" in out and "chapters/fast.ipynb" not in out  # --top 1
    assert "tests.test_b::test_slow[x]" in out and "test_fast" not in out
    assert timings.read_junit(tmp_path / "unit.xml")[0] == (12.25, "tests.test_b::test_slow[x]")


def test_no_timings_is_said_not_failed(tmp_path, capsys):
    assert timings.main(["--dir", str(tmp_path)]) == 0
    assert "run make test" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        timings.main(["--dir", str(tmp_path), "--top", "0"])
