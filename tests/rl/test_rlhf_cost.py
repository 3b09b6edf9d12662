import math

import pytest

from utils.attention.decode_cost import decode_step_cost, param_count, params_read_per_step
from utils.gpu.roofline import min_seconds
from utils.parallel.memory import zero_model_state_breakdown, zero_model_state_bytes
from utils.gpu.hardware import spec
from utils.parallel.training import FORWARD_FLOPS_PER_PARAM_PER_TOKEN as FORWARD
from utils.parallel.training import training_flops
from utils.rl.rlhf_cost import (MODEL_NAMES, generation_seconds, link_bandwidth, policy_model, response_lengths,
                                rlhf_memory_bytes, rlhf_step_time, weight_sync_seconds)

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


def test_generation_sums_exactly_the_scalar_decode_steps():
    """The array form of the decode steps is the loop over decode_step_cost, bit for bit (sliding window too)."""
    from utils.attention.kv_cache import MODELS
    from utils.rl.rlhf_cost import PolicyModel

    mistral = PolicyModel("Mistral-7B", param_count("Mistral-7B"), params_read_per_step("Mistral-7B"),
                          MODELS["Mistral-7B"], 14336)
    cases = [(policy_model("LLaMA-2-7B"), 128, 256, 1024, 8, 1), (policy_model("LLaMA-2-70B"), 64, 3000, 2000, 64, 4),
             (policy_model("Llama-3-8B"), 7, 1, 3, 8, 2), (mistral, 1000, 4000, 300, 8, 1)]
    for model, n_sequences, prompt_len, response_len, n_gpus, tp in cases:
        per_replica = -(-n_sequences // (n_gpus // tp))
        expected = 2 * model.n_params_read * per_replica * prompt_len / (spec("H100-SXM").flops("bf16") * 0.4 * tp)
        for t in range(response_len):
            expected += min_seconds(decode_step_cost(model.n_params_read, model.attention, per_replica,
                                                     prompt_len + t), "H100-SXM", "bf16") / tp
        assert generation_seconds(model, n_sequences, prompt_len, response_len, n_gpus, tp) == expected


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


# --- epochs, the old-policy log-prob pass, ZeRO-3 communication and the weight sync (issue 23, item 1) ---

def _ppo7(**kw):
    return rlhf_step_time("ppo", policy_model("LLaMA-2-7B"), 16, 8, 256, 1024, **kw)


def test_training_scales_with_epochs_and_the_log_prob_pass_is_one_forward():
    one, four = _ppo7(epochs=1), _ppo7(epochs=4)
    assert four.training == pytest.approx(4 * one.training)
    assert four.generation == one.generation and four.scoring == one.scoring
    # the old policy's log-probs: one 2N forward of the policy, a third of PPO's three scoring passes
    assert one.old_log_probs == pytest.approx(one.scoring / 3)
    assert _ppo7(old_log_probs=False).old_log_probs == 0
    # training is 6N per token per trained model per epoch, from part 2's calculator
    cluster = 8 * spec("H100-SXM").flops("bf16") * 0.4
    assert four.training == pytest.approx(4 * 2 * training_flops(N7_EXACT, 128 * 1280) / cluster)


N7_EXACT = param_count("LLaMA-2-7B")


def test_ppo_share_halves_with_four_epochs_and_the_log_prob_pass():
    """Issue 23: 49 % with one epoch and nothing else, 24 % with TRL's num_ppo_epochs=4 and the log-prob pass."""
    bare = _ppo7(old_log_probs=False, weight_sync=False)
    full = _ppo7(epochs=4)
    assert round(100 * bare.generation_share) == 49
    assert round(100 * full.generation_share) == 24
    # derived by hand: shares are G / (G + 3F + 2T) and G / (G + 4F + 8T) with T = 3F, G the same
    f = bare.scoring / 3
    assert full.generation_share == pytest.approx(
        bare.generation / (bare.generation + 4 * f + 8 * 3 * f + full.weight_sync + full.communication))


def test_weight_sync_is_the_missing_slice_of_the_weights():
    n = 1e9
    # colocated: each GPU holds 2N/8 under ZeRO-3 and needs 2N/tp to decode
    assert weight_sync_seconds(n, 8, 1, 1e9) == pytest.approx(2 * n * (1 - 1 / 8) / 1e9)
    assert weight_sync_seconds(n, 8, 8, 1e9) == 0  # tp = n_gpus: the shards are already the slices (in this model)
    # disaggregated: all 2N bytes from the trainer
    assert weight_sync_seconds(n, 8, 2, 50e9, colocated=False) == pytest.approx(2 * n / 50e9)
    assert link_bandwidth("H100-SXM", 8) == 450e9 and link_bandwidth("H100-SXM", 16) == 50e9


def test_zero3_gathers_are_hidden_on_nvlink_but_exposed_on_small_micro_batches_across_nodes():
    m = policy_model("LLaMA-2-7B")
    assert _ppo7().communication == 0  # 4 x 1280 tokens per micro-batch hide a 7B gather at 450 GB/s
    exposed = rlhf_step_time("grpo", m, 16, 8, 256, 1024, n_gpus=64, micro_batch_size=1)
    assert exposed.communication > 0
    # threshold: a forward's gather 2N (n-1)/n / BW against 2N T / (mfu peak): hidden iff T >= mfu peak (n-1)/n / BW
    tokens_to_hide = 0.4 * spec("H100-SXM").flops("bf16") * (63 / 64) / 50e9
    assert 4 * 1280 < tokens_to_hide < 8 * 1280
    assert rlhf_step_time("grpo", m, 64, 8, 256, 1024, n_gpus=64, micro_batch_size=4).communication > 0
    assert rlhf_step_time("grpo", m, 64, 8, 256, 1024, n_gpus=64, micro_batch_size=8).communication == 0


def test_long_tail_lowers_the_trained_tokens_but_not_the_decode_steps():
    m = policy_model("LLaMA-2-7B")
    full = rlhf_step_time("grpo", m, 16, 8, 256, 1024)
    tail = rlhf_step_time("grpo", m, 16, 8, 256, 1024, mean_response_len=384)
    assert tail.generation == full.generation
    assert tail.training == pytest.approx(full.training * (256 + 384) / (256 + 1024))
    assert tail.generation_share > full.generation_share


@pytest.mark.parametrize("call", [
    lambda: _ppo7(epochs=0),
    lambda: _ppo7(old_log_probs=1),
    lambda: _ppo7(mean_response_len=2048),
    lambda: _ppo7(bandwidth_bytes_per_s=0),
    lambda: weight_sync_seconds(1e9, 8, 3, 1e9),
    lambda: weight_sync_seconds(1e9, 8, 1, 1e9, colocated="yes"),
])
def test_new_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()


def test_a_megatron_trainer_syncs_once_per_optimizer_step_instead_of_gathering_per_micro_batch():
    """Llama 3 8B on 16 GPUs, TP 1 x PP 2 (DP 8), four optimizer steps: each a bf16 gradient reduce-scatter and a
    parameter all-gather of the stage's 2N/2 bytes, 7/8 of them per GPU, over the NIC."""
    m = policy_model("Llama-3-8B")
    kwargs = dict(n_gpus=16, micro_batch_size=1, reward_model=False)
    zero3 = rlhf_step_time("grpo", m, 64, 32, 128, 3968, **kwargs)
    megatron = rlhf_step_time("grpo", m, 64, 32, 128, 3968, trainer="megatron", trainer_pp=2, optimizer_steps=4,
                              **kwargs)
    assert zero3.communication > 50 * megatron.communication  # 128 micro-batches of one sequence per GPU, each gathering 16 GB
    assert megatron.communication == pytest.approx(4 * 2 * (2 * m.n_params / 2) * (7 / 8) / 50e9, rel=1e-12)
    assert (megatron.generation, megatron.training, megatron.scoring) == (zero3.generation, zero3.training,
                                                                          zero3.scoring)
    single = rlhf_step_time("grpo", m, 64, 32, 128, 3968, n_gpus=2, trainer="megatron", trainer_pp=2)
    assert single.communication == 0  # DP 1: nothing to synchronise


@pytest.mark.parametrize("call, message", [
    (lambda: _ppo7(trainer="fsdp"), "trainer must be one of"),
    (lambda: _ppo7(trainer="megatron", trainer_pp=3), r"divisible by tp x trainer_pp \(1 x 3\)"),
    (lambda: _ppo7(optimizer_steps=0), "optimizer_steps"),
])
def test_bad_trainers_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_response_lengths_have_the_mean_asked_and_a_tail_at_the_cap():
    lengths = response_lengths(2048, 932, 3968)
    assert abs(lengths.mean() - 932) < 0.5 and lengths.max() == 3968 and lengths.min() >= 1
    assert list(lengths) == sorted(lengths, reverse=True)
    assert (response_lengths(2048, 932, 3968) == lengths).all()  # quantiles, not samples
    # the censored exponential: E[L] ~ theta (1 - exp(-M/theta)) and exp(-M/theta) of them at the cap
    capped = (lengths == 3968).mean()
    theta = 932 / (1 - capped)
    assert capped == pytest.approx(math.exp(-3968 / theta), abs=2 / 2048)
    with pytest.raises(ValueError, match=r"mean_len must be in \[1, max_len = 100\)"):
        response_lengths(8, 100, 100)


def test_generation_over_a_length_distribution_decodes_only_the_running_sequences():
    """Two replicas, eight sequences: the slowest replica holds every second length from the longest; step t
    decodes those still running, each step the scalar roofline of that batch at context P + t."""
    m = policy_model("LLaMA-2-7B")
    lengths = response_lengths(8, 40, 100)
    slowest = lengths[::2]
    expected = FORWARD * m.n_params_read * 4 * 16 / (spec("H100-SXM").flops("bf16") * 0.4)
    for t in range(int(slowest.max())):
        running = int((slowest > t).sum())
        expected += min_seconds(decode_step_cost(m.n_params_read, m.attention, running, 16 + t), "H100-SXM", "bf16")
    got = generation_seconds(m, 8, 16, 100, n_gpus=2, lengths="exponential", mean_response_len=40)
    assert got == pytest.approx(expected, rel=1e-12)
    assert got < generation_seconds(m, 8, 16, 100, n_gpus=2)  # every sequence to 100 tokens


def test_a_decode_fraction_divides_every_decode_step():
    m = policy_model("Llama-3-8B")
    prefill = generation_seconds(m, 64, 128, 1, n_gpus=8) - min_seconds(
        decode_step_cost(m.n_params_read, m.attention, 8, 128), "H100-SXM", "bf16")
    kwargs = dict(n_gpus=8, lengths="exponential", mean_response_len=300)
    bound = generation_seconds(m, 64, 128, 1000, **kwargs)
    halved = generation_seconds(m, 64, 128, 1000, decode_fraction=lambda batch: 0.5, **kwargs)
    assert halved - prefill == pytest.approx(2 * (bound - prefill), rel=1e-9)
    by_batch = generation_seconds(m, 64, 128, 1000, decode_fraction=lambda batch: 0.5 if batch <= 4 else 1.0,
                                  **kwargs)
    assert bound < by_batch < halved  # the tail of small batches pays the lower fraction


@pytest.mark.parametrize("call, message", [
    (lambda: generation_seconds(policy_model("LLaMA-2-7B"), 8, 16, 100, lengths="median"), "lengths must be one of"),
    (lambda: generation_seconds(policy_model("LLaMA-2-7B"), 8, 16, 100, lengths="exponential"),
     "needs mean_response_len"),
])
def test_bad_length_models_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_recompute_adds_one_forward_to_every_trained_pass():
    m = policy_model("Llama-3-8B")
    plain = rlhf_step_time("grpo", m, 16, 8, 256, 1024, epochs=2)
    again = rlhf_step_time("grpo", m, 16, 8, 256, 1024, epochs=2, recompute=True)
    assert again.training == pytest.approx(plain.training * 8 / 6, rel=1e-12)
    assert (again.scoring, again.old_log_probs, again.generation) == (plain.scoring, plain.old_log_probs,
                                                                      plain.generation)
    dpo = rlhf_step_time("dpo", m, 16, 2, 256, 1024)
    assert rlhf_step_time("dpo", m, 16, 2, 256, 1024, recompute=True).training == pytest.approx(dpo.training * 8 / 6)
    with pytest.raises(ValueError, match="recompute must be True or False"):
        rlhf_step_time("grpo", m, 16, 8, 256, 1024, recompute="yes")
