"""Context and expert parallelism in the planner: CP = 1 and EP changes leave the rest alone, costs scale as derived."""

import dataclasses

import pytest

from utils.parallel.frontier.context_parallel import min_local_seq_to_hide, ring_step_costs
from utils.parallel.frontier.expert_parallel import all_to_all_seconds, node_limited_all_to_all_bytes
from utils.parallel.frontier.moe_costs import MODELS, moe_param_counts
from utils.parallel.planning.planner import (COMPUTE_EFFICIENCY, NIC_LATENCY_S, NVLINK_LATENCY_S, Cluster, Layout,
                                             plan)
from utils.parallel.planning.planner_5d import (
    MoELayout,
    cp_equivalent,
    cp_exposed_seconds_per_layer,
    cp_ring_hides,
    ep_all_to_all_seconds,
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


# --- DeepSeek-V3's wire format: node-limited routing and an 8-bit dispatch ------------------------------------

@pytest.mark.parametrize("world, max_nodes, top_k, remote_visits", [
    (64, 4, 8, 4 * 7 / 8),  # 8 nodes, M = 4 < n: 4 node visits per token, 1 in 8 of them to its own node
    (64, 8, 8, 8 * 7 / 8),  # M = n: the cap does not bind, yet each node gets the token once (7, not 8 x 63/64)
    (64, 16, 8, 8 * 7 / 8),  # M > n: as M = n
    (64, 4, 2, 2 * 7 / 8),  # k < M: two experts reach at most two nodes
    (32, 4, 8, 4 * 3 / 4),  # 4 nodes, M = n: 3 remote visits
    (32, 2, 8, 2 * 3 / 4),  # 4 nodes, M < n
    (8, 4, 8, 0.0),  # one node: nothing crosses the network
])
def test_node_limited_bytes_by_hand(world, max_nodes, top_k, remote_visits):
    network, nvlink = node_limited_all_to_all_bytes(100, 10, top_k, world, 8, max_nodes, element_size=2)
    assert network == pytest.approx(100 * remote_visits * 10 * 2, rel=1e-12)
    # Over NVLink: each of the k copies lands on another GPU of its node 7 times in 8.
    assert nvlink == pytest.approx(100 * top_k * 7 / 8 * 10 * 2, rel=1e-12)


def test_node_limited_bytes_reject_bad_inputs():
    with pytest.raises(ValueError, match="whole nodes"):
        node_limited_all_to_all_bytes(100, 10, 8, 60, 8, 4)
    with pytest.raises(ValueError, match="max_nodes"):
        node_limited_all_to_all_bytes(100, 10, 8, 64, 8, 0)
    with pytest.raises(ValueError, match="element_size"):
        node_limited_all_to_all_bytes(100, 10, 8, 64, 8, 4, element_size=3)


def _wire(e, remote_visits=4 * 7 / 8):
    """One all-to-all of DeepSeek-V3's layer by hand: 4,096 tokens, h = 7,168, e bytes per value, EP 64 on 8 nodes.

    The network leg (7 other nodes, 50 GB/s) and the NVLink leg (7 other GPUs, an H100's 450 GB/s each way)
    overlap: the longer one counts.
    """
    network = 4096 * remote_visits * 7168 * e
    nvlink = 4096 * 8 * 7 / 8 * 7168 * e
    return max(7 * NIC_LATENCY_S + network / 50e9, 7 * NVLINK_LATENCY_S + nvlink / 450e9)


def test_moe_node_limited_and_fp8_dispatch_by_hand():
    assert H800ISH.spec.nvlink_bandwidth == 900e9
    per_step = 4 * (15360 // 128)  # 4 MoE layers on the fullest stage x 120 micro-batches
    bf16 = plan_moe(DSV3, 128, 192, 128, H800ISH, _moe_layout(), max_nodes=4).time["EP all-to-all (exposed)"]
    assert bf16 == pytest.approx(per_step * 4 * _wire(2), rel=1e-12)
    assert _wire(2) == pytest.approx(7 * NIC_LATENCY_S + 4096 * 3.5 * 7168 * 2 / 50e9)  # the network leg binds
    # FP8 halves the two all-to-alls towards the experts (dispatch; the gradient before the down-projections),
    # not the two combines: 3/4 of the bytes, where halving all four would give 1/2 and halving one 7/8.
    fp8 = plan_moe(DSV3, 128, 192, 128, H800ISH, _moe_layout(), max_nodes=4, dispatch_bytes=1)
    assert fp8.time["EP all-to-all (exposed)"] == pytest.approx(per_step * 2 * (_wire(1) + _wire(2)), rel=1e-12)
    assert fp8.time["EP all-to-all (exposed)"] / bf16 == pytest.approx(0.75, abs=0.005)  # latencies do not halve
    # Without node-limiting, FP8 dispatch alone: the default per-copy pricing at 1 and 2 bytes.
    copies = [63 * 4 * 128 * 7168 * e for e in (1, 2)]
    plain = [all_to_all_seconds(64, n, 50e9, NIC_LATENCY_S) for n in copies]
    fp8_only = plan_moe(DSV3, 128, 192, 128, H800ISH, _moe_layout(), dispatch_bytes=1)
    assert fp8_only.time["EP all-to-all (exposed)"] == pytest.approx(per_step * 2 * sum(plain), rel=1e-12)
    # A NIC 20 times faster (1 TB/s): the NVLink fan-out is now the longer leg.
    fast_nic = Cluster("H100-SXM", 2048, nvlink_domain=8, nic_bandwidth=1e12)
    assert ep_all_to_all_seconds(DSV3, fast_nic, _moe_layout(), 2, max_nodes=4) == pytest.approx(
        7 * NVLINK_LATENCY_S + 4096 * 8 * 7 / 8 * 7168 * 2 / 450e9, rel=1e-12)
    # Node-limiting moves only the all-to-alls: compute, memory and the rest are those of the default plan.
    default = plan_moe(DSV3, 128, 192, 128, H800ISH, _moe_layout())
    assert fp8.memory == default.memory
    assert {k: v for k, v in fp8.time.items() if k != "EP all-to-all (exposed)"} == \
        {k: v for k, v in default.time.items() if k != "EP all-to-all (exposed)"}


def test_moe_defaults_keep_every_copy_in_bf16_and_a_node_local_group_ignores_max_nodes():
    default = plan_moe(DSV3, 128, 192, 128, H800ISH, _moe_layout())
    explicit = plan_moe(DSV3, 128, 192, 128, H800ISH, _moe_layout(), dispatch_bytes=2, combine_bytes=2,
                        max_nodes=None)
    assert explicit == default
    inside = MoELayout(pp=16, dp=128, ep=8, seq_len=4096, micro_batch=1, global_batch=15360)
    assert plan_moe(DSV3, 128, 192, 128, H800ISH, inside, max_nodes=4) == plan_moe(DSV3, 128, 192, 128, H800ISH,
                                                                                      inside)
    # With TP 2 the EP group of 64 spans 16 nodes, 4 of its ranks on each, each sending its 2,048 tokens.
    tp2 = _moe_layout(tp=2)
    network, nvlink = node_limited_all_to_all_bytes(2048, 7168, 8, 64, 4, 4, 2)
    assert network == pytest.approx(2048 * 4 * 15 / 16 * 7168 * 2)
    assert ep_all_to_all_seconds(DSV3, H800ISH, tp2, 2, max_nodes=4) == pytest.approx(
        max(15 * NIC_LATENCY_S + network / 50e9, 3 * NVLINK_LATENCY_S + nvlink / 450e9))


def test_moe_node_limited_rejects_groups_that_do_not_fill_nodes():
    six = Cluster("H100-SXM", 2048, nvlink_domain=6, nic_bandwidth=50e9)
    with pytest.raises(ValueError, match="whole nodes"):
        plan_moe(DSV3, 128, 192, 128, six, _moe_layout(), max_nodes=4)
    with pytest.raises(ValueError, match="max_nodes"):
        plan_moe(DSV3, 128, 192, 128, H800ISH, _moe_layout(), max_nodes=0)
    with pytest.raises(ValueError, match="max_nodes"):  # refused even where a node-local group would ignore it
        ep_all_to_all_seconds(DSV3, H800ISH, _moe_layout(ep=8), 2, max_nodes=0)
    with pytest.raises(ValueError, match="element_size"):
        plan_moe(DSV3, 128, 192, 128, H800ISH, _moe_layout(), dispatch_bytes=3)
