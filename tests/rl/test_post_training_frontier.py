"""The accuracy-KL frontier of GRPO, DPO and expert iteration: the --quick sweep's structure, and the recording.

The quick sweep is too small to train anything (a few steps), so it pins the structure and what holds
at any size: KL is exactly 0 where the policy is the reference and positive once it has moved. The
recording (``benchmarks/results/post_training_frontier.json``, the full sweep) pins what labs 04 and 05
say about it: at least 3 seeds per point, and the orderings the text states.
"""

import json
import math

import pytest

from benchmarks import post_training_frontier as frontier
from utils.recorded import RESULTS_DIR

RECORDING = RESULTS_DIR / "post_training_frontier.json"


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("frontier") / "quick.json"
    record = frontier.main(["--quick", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(record))  # what it wrote is what it returned
    return record


def _check_structure(record, n_seeds):
    settings = record["meta"]["settings"]
    assert {"date", "torch", "threads", "settings"} <= set(record["meta"])
    assert len(settings["seeds"]) == len(set(settings["seeds"])) >= n_seeds
    for p in record["points"] + record["grpo_variants"] + record["sft"]:
        assert 0 <= p["accuracy"] <= 1 and p["kl"] > -1e-6
    for p in record["sft"]:
        assert p["kl"] == 0  # the reference against itself
    expected_rows = (len(settings["grpo_betas"]) + len(settings["dpo_betas"]) + settings["ei_rounds"])
    assert len(record["summary"]) == expected_rows
    for row in record["summary"] + record["grpo_variants_summary"]:
        assert row["n_seeds"] == len(settings["seeds"])
        assert row["accuracy_std"] >= 0 and row["kl_std"] >= 0
    by_setting = {}
    for p in record["points"]:
        by_setting.setdefault((p["method"], p.get("beta"), p.get("rounds")), set()).add(p["seed"])
    assert all(seeds == set(settings["seeds"]) for seeds in by_setting.values())


def test_quick_sweep_structure_and_kl_relation(quick):
    _check_structure(quick, 2)
    for p in quick["points"]:
        if "trajectory" in p:  # evaluated during training: step 0 is the reference itself
            assert p["trajectory"]["step"][0] == 0 and p["trajectory"]["kl"][0] == 0
        assert p["kl"] > 0, f"{p['method']} did not move away from the reference"


def test_summary_is_mean_and_sample_std_of_the_seeds():
    points = [{"method": "m", "beta": 1, "accuracy": a, "kl": k, "len_right": 2.0, "len_wrong": float("nan")}
              for a, k in ((0.5, 0.1), (0.7, 0.3), (0.9, 0.2))]
    (row,) = frontier.summarise(points, ("method", "beta"))
    assert row["n_seeds"] == 3 and row["accuracy_mean"] == pytest.approx(0.7)
    assert row["accuracy_std"] == pytest.approx(0.2)  # sqrt((0.04 + 0 + 0.04) / 2)
    assert row["kl_std"] == pytest.approx(0.1) and "len_wrong_mean" not in row


@pytest.fixture(scope="module")
def recording():
    return json.loads(RECORDING.read_text())


def test_recording_has_three_seeds_per_point(recording):
    _check_structure(recording, 3)
    assert recording["meta"]["settings"] == frontier.FULL  # recorded with the script's current settings


def _rows(recording, method):
    return sorted((r for r in recording["summary"] if r["method"] == method),
                  key=lambda r: r["beta"] if r["beta"] is not None else r["rounds"])


def _dominated_in_every_seed(recording, loser, winner):
    """Each seed's ``loser`` points have a ``winner`` point of the same seed with no more KL and at least the gain."""
    points = recording["points"]
    return all(any(w["kl"] <= lo["kl"] and w["gain"] >= lo["gain"]
                   for w in points if w["method"] == winner and w["seed"] == lo["seed"])
               for lo in points if lo["method"] == loser)


def test_recording_supports_what_lab_05_says(recording):
    """Lab 05: DPO is behind GRPO and expert iteration at equal KL in every seed; its curve slopes down."""
    assert _dominated_in_every_seed(recording, "dpo", "grpo")
    assert _dominated_in_every_seed(recording, "dpo", "expert_iteration")
    assert not _dominated_in_every_seed(recording, "grpo", "expert_iteration")  # neither of these two is
    assert not _dominated_in_every_seed(recording, "expert_iteration", "grpo")  # ahead in every seed
    dpo = _rows(recording, "dpo")
    assert all(a["kl_mean"] > b["kl_mean"] and a["gain_mean"] < b["gain_mean"] for a, b in zip(dpo, dpo[1:]))
    assert dpo[0]["gain_mean"] < 0  # beta = 0.1 ends below its SFT model
    grpo = {r["beta"]: r for r in _rows(recording, "grpo")}
    assert grpo[1.0]["kl_mean"] < grpo[0.2]["kl_mean"] < min(grpo[0.0]["kl_mean"], grpo[0.04]["kl_mean"])
    ei = _rows(recording, "expert_iteration")
    assert all(a["gain_mean"] < b["gain_mean"] and a["kl_mean"] < b["kl_mean"] for a, b in zip(ei, ei[1:]))


def test_recording_supports_what_lab_04_says(recording):
    """Lab 04: the four GRPO variants differ less than the seeds do, and their right answers are as long."""
    rows = recording["grpo_variants_summary"]
    assert {(r["scale_rewards"], r["loss_type"]) for r in rows} == {tuple(v) for v in frontier.FULL["variants"]}
    gains = [r["gain_mean"] for r in rows]
    assert max(gains) - min(gains) < min(r["gain_std"] for r in rows)
    assert max(r["len_right_mean"] for r in rows) - min(r["len_right_mean"] for r in rows) < 0.01
    assert all(not math.isnan(r["len_wrong_mean"]) for r in rows)
