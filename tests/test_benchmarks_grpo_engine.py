"""benchmarks.grpo_engine: the recorded GRPO-with-engine runs, as a quick smoke test."""

import json

from benchmarks import grpo_engine


def test_quick_run_writes_both_modes_and_both_schedules(tmp_path, capsys):
    out = tmp_path / "grpo.json"
    assert grpo_engine.main(["--quick", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert [(r["seed"], r["off_policy"]) for r in record["runs"]] == [(0, False), (0, True)]
    assert all(len(r["accuracy"]) == 2 for r in record["runs"])  # step 0 and the end
    assert set(record["async"]) == {"sync", "async"}
    assert record["async"]["async"]["sync_bytes"] > 0
    assert "one step off" in capsys.readouterr().out
