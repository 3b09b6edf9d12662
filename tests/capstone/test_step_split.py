"""Part 4's RLHF cost model applied to capstone 2's step (utils.capstone.step_split), and the schedule figure's model."""

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch

from utils.attention.llama import TinyLlama
from utils.capstone import grpo_plots as gp
from utils.capstone import step_split as ss
from utils.capstone.engine_rollouts import CONFIG
from utils.capstone.grpo_engine import Settings
from utils.gpu import hardware
from utils.rl.rlhf_cost import policy_model, rlhf_step_time

RECORD = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/results/grpo_engine.json").read_text())


def test_the_tiny_policy_is_counted_as_the_model_is_built():
    policy = ss.tiny_policy()
    assert policy.n_params == sum(p.numel() for p in TinyLlama(CONFIG).parameters()) == 75_840
    assert policy.n_params - policy.n_params_read == CONFIG.vocab * CONFIG.dim  # the embedding is not read
    assert (policy.attention.n_heads, policy.attention.n_kv_heads, policy.attention.head_dim) == (4, 2, 16)


def test_a_measured_machine_prices_a_step_as_the_gpu_with_the_same_rates_does():
    """hardware.spec passes a GpuSpec through, so the cost model takes a machine described by its own rates."""
    h100 = hardware.spec("H100-SXM")
    machine = ss.measured_machine(h100.flops("bf16"), h100.hbm_bandwidth)
    assert hardware.spec(machine) is machine
    kwargs = dict(n_prompts=8, group_size=4, prompt_len=128, response_len=256, n_gpus=8,
                  bandwidth_bytes_per_s=100e9)
    assert rlhf_step_time("grpo", policy_model("Llama-3-8B"), gpu=machine, **kwargs) == \
        rlhf_step_time("grpo", policy_model("Llama-3-8B"), gpu="H100-SXM", **kwargs)


def test_the_rate_is_fitted_on_training_and_the_log_probs_follow_from_the_flop_counts():
    settings = Settings(inner_epochs=2)
    step, rate = ss.predicted_step(0.09, 5e9, settings)
    phases = ss.as_phases(step)
    assert phases["training"] == pytest.approx(0.09, rel=1e-12)
    # two forwards (old policy, reference) of 2N per token against two passes of 6N
    assert phases["log-probs"] == pytest.approx(0.09 * 4 / 12, rel=1e-12)
    assert phases["weight sync"] == 0.0  # one device: the colocated sync moves nothing
    tokens = 16 * 8 * 7
    assert rate == pytest.approx(2 * 6 * 75_840 * tokens / 0.09, rel=1e-12)
    assert 0 < phases["generation"] < phases["log-probs"]  # about one forward over the same tokens


def test_the_measured_split_reads_the_synchronous_run_per_step():
    split = ss.measured_split(RECORD)
    run = RECORD["async"]["sync"]
    assert list(split) == list(ss.PHASES)
    assert split["generation"] == pytest.approx(run["engine"]["generate"] / run["steps"])
    assert split["weight sync"] == pytest.approx(run["trainer"]["send weights"] / run["steps"])
    rows = ss.compare(split, {p: 2 * s for p, s in split.items()})
    assert [r.phase for r in rows] == list(ss.PHASES) and all(r.ratio == pytest.approx(0.5) for r in rows)
    with pytest.raises(ValueError, match="mode must be one of"):
        ss.measured_split(RECORD, "overlapped")


@pytest.mark.parametrize("call, message", [
    (lambda: ss.measured_machine(0, 1e9), "flops_per_s"),
    (lambda: ss.measured_machine(1e9, -1), "bytes_per_s"),
    (lambda: ss.predicted_step(0, 1e9), "training_seconds"),
])
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_engine_step_overhead_times_one_request_and_a_full_batch():
    torch.manual_seed(0)
    one, batch = ss.engine_step_overhead(TinyLlama(CONFIG).double().eval(), prompts=2, group_size=2, repeats=1)
    assert (one.requests, batch.requests) == (1, 4)
    assert one.steps >= 2 and batch.steps >= 2 and one.seconds_per_step > 0 and batch.seconds_per_step > 0
    assert ss.copy_bandwidth(2 ** 20, repeats=2) > 0


@pytest.mark.parametrize("g, lp, tr, s", [(0.15, 0.03, 0.09, 0.013), (0.05, 0.03, 0.2, 0.0), (0.1, 0.0, 0.1, 0.02)])
def test_the_schedule_sums_the_phases_synchronously_and_overlaps_them_asynchronously(g, lp, tr, s):
    assert gp.step_seconds(g, lp, tr, s, "sync") == pytest.approx(g + lp + tr + s)
    assert gp.step_seconds(g, lp, tr, s, "async") == pytest.approx(max(g, lp + tr) + s)
    for mode in gp.MODES:
        bars = gp.schedule(g, lp, tr, s, mode, steps=4)
        for lane in ("engine", "trainer"):
            spans = sorted((a, b) for ln, _, a, b in bars if ln == lane)
            assert all(b1 <= a2 + 1e-12 for (_, b1), (a2, _) in zip(spans, spans[1:])), (mode, lane)
        assert sum(phase == "train" for _, phase, _, _ in bars) == 4


def test_the_figures_draw_and_bad_schedules_are_refused():
    for fig in (gp.plot_accuracy(RECORD), gp.plot_ratios(RECORD), gp.plot_schedule()):
        assert fig.axes
        plt.close(fig)
    assert gp.mean_accuracy(RECORD, False)[0] == pytest.approx(
        sum(r["accuracy"][0] for r in RECORD["runs"] if not r["off_policy"]) / 3)
    with pytest.raises(ValueError, match="mode must be one of"):
        gp.schedule(0.1, 0.1, 0.1, 0.1, "pipelined")
    with pytest.raises(ValueError, match="generation"):
        gp.schedule(-0.1, 0.1, 0.1, 0.1, "sync")
