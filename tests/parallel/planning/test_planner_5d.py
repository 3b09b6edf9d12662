"""Context and expert parallelism in the planner: CP = 1 and EP changes leave the rest alone, costs scale as derived."""

import dataclasses

import pytest

from utils.parallel.frontier.context_parallel import min_local_seq_to_hide, ring_step_costs
from utils.parallel.frontier.expert_parallel import all_to_all_seconds
from utils.parallel.frontier.moe_costs import MODELS, moe_param_counts
from utils.parallel.planning.planner import COMPUTE_EFFICIENCY, NIC_LATENCY_S, Cluster, Layout, plan
from utils.parallel.planning.planner_5d import (
    MoELayout,
    cp_equivalent,
    cp_exposed_seconds_per_layer,
    cp_ring_hides,
    gpu_hours_per_trillion_tokens,
    plan_cp,
    plan_moe,
)
from utils.parallel.planning.published_runs import LLAMA3_405B, PUBLISHED_RUNS
from utils.parallel.planning.transformer_costs import Model

DSV3 = MODELS["DeepSeek-V3"]
H800ISH = Cluster("H100-SXM", 2048, nvlink_domain=8, nic_bandwidth=50e9)


@pytest.mark.parametrize("run", PUBLISHED_RUNS, ids=lambda r: r.name)
def test_cp_one_is_the_three_dimensional_planner(run):
    assert plan_cp(run.model, run.cluster, run.layout, cp=1) == plan(run.model, run.cluster, run.layout)


def _llama_long(cp=16, nic=50e9, seq=131_072):
    model = dataclasses.replace(LLAMA3_405B, seq_len=seq)
    gpus = 8 * 8 * 16 * cp
    layout = Layout(dp=8, tp=8, pp=16, micro_batch=1, global_batch=128, v=8, zero_stage=2, sequence_parallel=True,
                    recompute="selective", balance_embedding=True, grad_bytes=4)
    return model, Cluster("H100-SXM", gpus, 8, nic), layout


def test_cp_divides_activations_and_keeps_whole_sequence_attention_flops():
    model, cluster, layout = _llama_long()
    p = plan_cp(model, cluster, layout, cp=16)
    # Activations: those of s/16 tokens (selective recompute: linear in s).
    short, eq = cp_equivalent(model, layout, 16)
    assert short.seq_len == 8192 and eq.dp == 128 and eq.microbatches == layout.microbatches
    assert p.memory == plan(short, dataclasses.replace(cluster), eq).memory
    # FLOPs: the whole 128K sequence's attention, not 16 chunks of 8K.
    assert p.model_flops == model.model_flops(128)
    assert p.model_flops > short.model_flops(128 * 16)
    assert p.time["compute"] == pytest.approx(
        model.hardware_flops(128, "selective") / (cluster.n_gpus * cluster.spec.flops("bf16") * COMPUTE_EFFICIENCY))


def test_cp_ring_exposure_matches_the_closed_form():
    model, cluster, layout = _llama_long()
    assert cp_ring_hides(model, cluster, layout, 16)
    assert cp_exposed_seconds_per_layer(model, cluster, layout, 16) == 0.0
    # A slow NIC (1 GB/s): the ring no longer hides; exposure is by hand from ring_step_costs.
    slow = Cluster("H100-SXM", cluster.n_gpus, 8, 1e9)
    assert not cp_ring_hides(model, slow, layout, 16)
    nbytes, flops = ring_step_costs(8192, 16, 1, 128, 1, 2)
    rate = slow.spec.flops("bf16") * COMPUTE_EFFICIENCY
    by_hand = 3 * 15 * (nbytes / 1e9 + NIC_LATENCY_S - flops / 2 / rate)
    assert cp_exposed_seconds_per_layer(model, slow, layout, 16) == pytest.approx(by_hand)
    n_star = min_local_seq_to_hide(16, 1, rate, 1e9, 2, 0.5)
    assert 8192 < n_star


def test_cp_rejects_bad_layouts():
    model, cluster, layout = _llama_long()
    with pytest.raises(ValueError, match="2 x cp"):
        plan_cp(dataclasses.replace(model, seq_len=131_072 + 16), cluster, layout, cp=16)
    with pytest.raises(ValueError, match="dp x tp x pp x cp"):
        plan_cp(model, cluster, layout, cp=8)
    with pytest.raises(ValueError, match="cp"):
        plan_cp(model, cluster, layout, cp=0)


def _moe_layout(ep=64, tp=1, zero_stage=1):
    return MoELayout(pp=16, dp=128 // tp, ep=ep, seq_len=4096, micro_batch=1, global_batch=15360, tp=tp,
                     zero_stage=zero_stage)


def test_moe_expert_memory_divides_by_ep_and_dense_memory_by_tp():
    counts = moe_param_counts(DSV3)
    a, b = (plan_moe(DSV3, 128, 192, 128, H800ISH, _moe_layout(ep)) for ep in (64, 32))
    per_moe_layer = counts["routed_experts"] / (DSV3.n_layers - DSV3.n_dense_layers)
    moe_layers = -(-(DSV3.n_layers - DSV3.n_dense_layers) // 16)
    # Parameters (2 bytes each, ZeRO-1 leaves them whole): experts / ep more on b, nothing else changes.
    assert b.memory["parameters"] - a.memory["parameters"] == pytest.approx(
        2 * per_moe_layer * moe_layers * (1 / 32 - 1 / 64))


def test_moe_all_to_all_by_hand_and_overlap():
    p = plan_moe(DSV3, 128, 192, 128, H800ISH, _moe_layout())
    # 4 all-to-alls per MoE layer per micro-batch; capacity ceil(4096 * 8 / 256) = 128 tokens per expert.
    nbytes = 63 * 4 * 128 * 7168 * 2
    moe_layers, m = 4, 15360 // 128
    assert p.time["EP all-to-all (exposed)"] == pytest.approx(
        4 * moe_layers * m * all_to_all_seconds(64, nbytes, 50e9, NIC_LATENCY_S))
    hidden = plan_moe(DSV3, 128, 192, 128, H800ISH, _moe_layout(), ep_overlap=1.0)
    assert hidden.time["EP all-to-all (exposed)"] == 0.0
    assert hidden.time["compute"] == p.time["compute"]
    one = plan_moe(DSV3, 128, 192, 128, Cluster("H100-SXM", 2048, 8, 50e9),
                   MoELayout(pp=16, dp=128, ep=1, seq_len=4096, micro_batch=1, global_batch=15360))
    assert one.time["EP all-to-all (exposed)"] == 0.0
    assert gpu_hours_per_trillion_tokens(hidden) == pytest.approx(2048 * 1e12 / hidden.tokens_per_s / 3600)


def test_moe_rejects_bad_layouts():
    with pytest.raises(ValueError, match="ep must divide dp"):
        MoELayout(pp=16, dp=128, ep=48, seq_len=4096, micro_batch=1, global_batch=15360)
    with pytest.raises(ValueError, match="ep divide the routed experts"):  # Mixtral: 8 experts on 16 ranks
        plan_moe(MODELS["Mixtral 8x7B"], 32, 128, 128, Cluster("H100-SXM", 16),
                 MoELayout(pp=1, dp=16, ep=16, seq_len=4096, micro_batch=1, global_batch=16))
    with pytest.raises(ValueError, match="number of GPUs"):
        plan_moe(DSV3, 128, 192, 128, Cluster("H100-SXM", 1024), _moe_layout())
    with pytest.raises(ValueError, match="ep_overlap"):
        plan_moe(DSV3, 128, 192, 128, H800ISH, _moe_layout(), ep_overlap=1.5)


def test_moe_zero3_shards_parameters_and_gathers_twice():
    one, three = (plan_moe(DSV3, 128, 192, 128, H800ISH, _moe_layout(zero_stage=z)) for z in (1, 3))
    # ZeRO-3 (FSDP): the dense weights / 128 and the experts' / 2 (their DP group); gradients / DP too.
    assert three.memory["parameters"] < one.memory["parameters"] / 2
    assert three.memory["gradients"] < one.memory["gradients"] / 2
    assert three.memory["optimizer"] == pytest.approx(one.memory["optimizer"])
    # A second parameter all-gather per step: DP time grows by less than a half (grads are 4 bytes, weights 2).
    ratio = three.time["DP communication (exposed)"] / one.time["DP communication (exposed)"]
    assert 1.2 < ratio < 1.5
