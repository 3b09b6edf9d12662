import pytest

from utils.attention.kv_cache import kv_cache_bytes
from utils.parallel.memory import zero_model_state_breakdown, zero_model_state_bytes
from utils.rl.rlhf_cost import generation_seconds, policy_model, rlhf_step_time
from utils.rl.rollout_systems import (PLACEMENTS, generator_memory_bytes, placement_memory_bytes, steady_step_seconds,
                                      step_timeline)

M7, M70 = policy_model("LLaMA-2-7B"), policy_model("LLaMA-2-70B")


def test_generator_weights_are_unsharded_per_tp_group():
    """Issue 23, item 2: 13.5 GB per GPU at 7B (tp 1), 34.5 GB per GPU at 70B with tp 4."""
    assert generator_memory_bytes(M7, 1, 1, 1)["generator weights"] / 1e9 == pytest.approx(13.48, abs=0.01)
    assert generator_memory_bytes(M70, 4, 1, 1)["generator weights"] / 1e9 == pytest.approx(34.49, abs=0.01)
    # KV cache: part 3's 2 L H_kv d bytes per token, split over the TP group by KV head
    c = M70.attention
    assert generator_memory_bytes(M70, 4, 16, 1280)["KV cache"] == kv_cache_bytes(
        c.n_layers, c.n_kv_heads, c.head_dim, 1280, 16) / 4
    assert generator_memory_bytes(M7, 1, 16, 1280)["KV cache"] / 1e9 == pytest.approx(10.74, abs=0.01)


def test_colocated_holds_trainer_and_generator_at_once():
    mem = placement_memory_bytes("ppo", M7, 8, 1, 128, 1280)["every GPU"]
    assert mem["policy"] == zero_model_state_bytes(M7.n_params, 8, 3)
    assert mem["generator weights"] == 2 * M7.n_params
    assert sum(mem.values()) / 1e9 == pytest.approx(30.3 + 13.5 + 10.7, abs=0.2)


def test_sleep_mode_splits_the_peak_into_two_phases():
    both = placement_memory_bytes("ppo", M70, 64, 4, 128, 1280)["every GPU"]
    phases = placement_memory_bytes("ppo", M70, 64, 4, 128, 1280, sleep=True)
    assert set(phases) == {"training phase", "generation phase"}
    assert sum(phases["training phase"].values()) == pytest.approx(2 * zero_model_state_bytes(
        M70.n_params, 64, 3) + 2 * zero_model_state_breakdown(M70.n_params, 64, 3).params)
    assert max(sum(p.values()) for p in phases.values()) < sum(both.values())
    # generation phase: trained models keep only their bf16 shards
    assert phases["generation phase"]["policy"] == zero_model_state_breakdown(M70.n_params, 64, 3).params


def test_70b_ppo_needs_more_gpus_once_the_generator_is_counted():
    budget = 0.7 * 80e9
    def fits(n, **kw):
        peaks = placement_memory_bytes("ppo", M70, n, 4, 128, 1280, **kw).values()
        return max(sum(p.values()) for p in peaks) <= budget
    assert not fits(64) and fits(128)           # everything resident: 74 GB on 64 GPUs
    assert fits(64, sleep=True) and not fits(32, sleep=True)


def test_disaggregated_splits_the_gpus():
    mem = placement_memory_bytes("grpo", M7, 8, 2, 128, 1280, "disaggregated", n_rollout_gpus=4)
    assert mem["trainer GPU"]["policy"] == zero_model_state_bytes(M7.n_params, 4, 3)
    assert mem["rollout GPU"]["generator weights"] == M7.n_params  # 2 Psi / tp with tp = 2
    # 128 sequences over 4 / 2 = 2 replicas
    assert mem["rollout GPU"] == generator_memory_bytes(M7, 2, 64, 1280)


def test_colocated_timeline_is_the_step_time_repeated():
    segs = step_timeline("colocated", "grpo", M7, 16, 8, 256, 1024, n_steps=3, epochs=2)
    t = rlhf_step_time("grpo", M7, 16, 8, 256, 1024, epochs=2)
    assert steady_step_seconds(segs) == pytest.approx(t.total)
    assert segs[-1].end == pytest.approx(3 * t.total)


def test_async_overlaps_generation_with_training():
    kw = dict(n_rollout_gpus=4, n_steps=4)
    sync = steady_step_seconds(step_timeline("disaggregated", "grpo", M7, 16, 8, 256, 1024, **kw))
    asyn = steady_step_seconds(step_timeline("async", "grpo", M7, 16, 8, 256, 1024, **kw))
    gen = generation_seconds(M7, 128, 256, 1024, n_gpus=4)
    trainer = rlhf_step_time("grpo", M7, 16, 8, 256, 1024, n_gpus=4, weight_sync=False, generate=False)
    assert trainer.generation == 0
    rest = trainer.total
    sync_s = 2 * M7.n_params / 50e9
    assert sync == pytest.approx(gen + rest + sync_s)           # each side waits for the other
    assert asyn == pytest.approx(max(gen, rest) + sync_s)       # one side hides the other
    # and when generation is the longer side (2 rollout GPUs, 6 trainer GPUs), it sets the pace
    gen2 = generation_seconds(M7, 128, 256, 1024, n_gpus=2)
    two = steady_step_seconds(step_timeline("async", "grpo", M7, 16, 8, 256, 1024, n_rollout_gpus=2, n_steps=4))
    assert two == pytest.approx(gen2 + sync_s)
    # staleness: every batch after the first is generated before the previous batch's update arrives
    segs = step_timeline("async", "grpo", M7, 16, 8, 256, 1024, **kw)
    gens = [s for s in segs if s.phase == "generation"]
    trains = [s for s in segs if s.phase == "training"]
    assert all(g.start < t.end for g, t in zip(gens[1:], trains))


@pytest.mark.parametrize("call", [
    lambda: step_timeline("hybrid", "grpo", M7, 16, 8, 256, 1024),
    lambda: step_timeline("async", "grpo", M7, 16, 8, 256, 1024),  # no n_rollout_gpus
    lambda: step_timeline("disaggregated", "grpo", M7, 16, 8, 256, 1024, n_rollout_gpus=8),
    lambda: step_timeline("disaggregated", "grpo", M70, 16, 8, 256, 1024, tp=4, n_rollout_gpus=2),
    lambda: placement_memory_bytes("ppo", M7, 8, 1, 128, 1280, sleep=1),
    lambda: steady_step_seconds(step_timeline("colocated", "grpo", M7, 16, 8, 256, 1024, n_steps=1)),
    lambda: generator_memory_bytes(M7, 0, 1, 1),
])
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()


def test_placements_are_the_three_of_the_chapter():
    assert PLACEMENTS == ("colocated", "disaggregated", "async")


def test_the_rollout_lane_decodes_the_length_distribution_it_is_given():
    m = policy_model("Llama-3-8B")
    kwargs = dict(mean_response_len=400, lengths="exponential", decode_fraction=lambda batch: 0.7)
    segments = step_timeline("async", "grpo", m, 16, 8, 128, 2000, n_gpus=16, n_rollout_gpus=8, n_steps=2, **kwargs)
    first = next(s for s in segments if s.phase == "generation")
    assert first.end - first.start == generation_seconds(m, 128, 128, 2000, 8, 1, **kwargs)
    def generation(**kw):
        segs = step_timeline("async", "grpo", m, 16, 8, 128, 2000, n_gpus=16, n_rollout_gpus=8, n_steps=2,
                             mean_response_len=400, **kw)
        return next(s for s in segs if s.phase == "generation").end
    assert generation(lengths="exponential") < generation()  # every response to 2,000 tokens
    assert generation(lengths="exponential") < first.end  # the same lengths at 0.7 of the roof
