import pytest

from utils.attention.decode_cost import decode_step_cost, param_count, params_read_per_step
from utils.gpu.roofline import min_seconds
from utils.parallel.memory import zero_model_state_breakdown, zero_model_state_bytes
from utils.gpu.hardware import spec
from utils.parallel.training import training_flops
from utils.rl.rlhf_cost import (MODEL_NAMES, generation_seconds, policy_model, rlhf_memory_bytes, rlhf_step_time)

N7, N70 = 6.738e9, 68.98e9


def test_policy_models_match_part_3_counts_and_published_sizes():
    m = policy_model("LLaMA-2-7B")
    assert m.n_params == param_count("LLaMA-2-7B") == 6_738_415_616
    assert m.n_params_read == params_read_per_step("LLaMA-2-7B")
    assert policy_model("LLaMA-2-70B").n_params / 1e9 == pytest.approx(69.0, abs=0.05)  # Llama 2 paper: 70B


@pytest.mark.parametrize("n_params", [N7, N70])
@pytest.mark.parametrize("n_gpus,stage", [(1, 0), (8, 1), (8, 3), (64, 3)])
def test_memory_of_each_model_is_the_zero_calculator(n_params, n_gpus, stage):
    mem = rlhf_memory_bytes("ppo", n_params, n_gpus, stage)
    assert mem["policy"] == zero_model_state_bytes(n_params, n_gpus, stage)
    assert mem["value"] == zero_model_state_bytes(n_params, n_gpus, stage)
    frozen = zero_model_state_breakdown(n_params, n_gpus, stage).params
    assert mem["reference"] == mem["reward"] == frozen
    if stage == 0:  # 16 bytes per trained parameter, 2 per frozen one: 2 x 16 + 2 x 2 = 36 Psi
        assert sum(mem.values()) == pytest.approx(36 * n_params)


@pytest.mark.parametrize("n_gpus", [1, 8, 64])
def test_ppo_holds_more_than_grpo_more_than_dpo(n_gpus):
    totals = {a: sum(rlhf_memory_bytes(a, N7, n_gpus).values()) for a in ("ppo", "grpo", "dpo")}
    assert totals["ppo"] > totals["grpo"] > totals["dpo"]
    assert totals["dpo"] == zero_model_state_bytes(N7, n_gpus, 3)
    assert sum(rlhf_memory_bytes("dpo", N7, n_gpus, precompute_ref_log_probs=False).values()) > totals["dpo"]
    assert rlhf_memory_bytes("grpo", N7, n_gpus, reference=False)["reference"] == 0


def test_generation_is_the_sum_of_roofline_decode_steps():
    m = policy_model("LLaMA-2-7B")
    seconds = generation_seconds(m, 16, prompt_len=100, response_len=5, n_gpus=1, mfu=0.5)
    prefill = 2 * m.n_params_read * 16 * 100 / (spec("H100-SXM").flops("bf16") * 0.5)
    decode = sum(min_seconds(decode_step_cost(m.n_params_read, m.attention, 16, 100 + t)) for t in range(5))
    assert seconds == pytest.approx(prefill + decode)
    # one decode step at batch 16 is memory-bound: about the time to read the weights once
    weights = 2 * m.n_params_read / spec("H100-SXM").hbm_bandwidth
    assert min_seconds(decode_step_cost(m.n_params_read, m.attention, 16, 100)) == pytest.approx(weights, rel=0.1)


def test_training_is_6nd():
    m = policy_model("LLaMA-2-7B")
    t = rlhf_step_time("grpo", m, n_prompts=8, group_size=8, prompt_len=200, response_len=300, n_gpus=8, mfu=0.4,
                       reference=False, reward_model=False)
    assert t.scoring == 0
    cluster = 8 * spec("H100-SXM").flops("bf16") * 0.4
    assert t.training == pytest.approx(training_flops(m.n_params, 64 * 500) / cluster)
    dpo = rlhf_step_time("dpo", m, 8, 2, 200, 300)
    assert dpo.generation == 0 and dpo.generation_share == 0


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_generation_share_rises_with_response_length(name):
    m = policy_model(name)
    shares = [rlhf_step_time("grpo", m, 16, 8, 256, r, n_gpus=8, tp=8 if "70" in name else 1).generation_share
              for r in (64, 256, 1024)]
    assert shares[0] < shares[1] < shares[2]


def test_generation_share_falls_with_batch():
    m = policy_model("Llama-3-8B")
    shares = [rlhf_step_time("grpo", m, p, 8, 256, 512).generation_share for p in (1, 16, 256)]
    assert shares[0] > shares[1] > shares[2]


@pytest.mark.parametrize("call", [
    lambda: rlhf_memory_bytes("reinforce", N7),
    lambda: rlhf_memory_bytes("ppo", -1.0),
    lambda: rlhf_memory_bytes("ppo", N7, 8, stage=4),
    lambda: rlhf_memory_bytes("grpo", N7, reference=1),
    lambda: policy_model("GPT-5"),
    lambda: generation_seconds(policy_model("LLaMA-2-70B"), 8, 100, 10, n_gpus=8, tp=1),  # 138 GB > 80 GB
    lambda: rlhf_step_time("dpo", policy_model("LLaMA-2-7B"), 8, 4, 100, 100),
    lambda: rlhf_step_time("grpo", policy_model("LLaMA-2-7B"), 8, 4, 100, 0),
    lambda: rlhf_step_time("grpo", policy_model("LLaMA-2-7B"), 8, 4, 100, 10, n_gpus=8, tp=3),
    lambda: rlhf_step_time("grpo", policy_model("LLaMA-2-7B"), 8, 4, 100, 10, mfu=1.5),
])
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()
