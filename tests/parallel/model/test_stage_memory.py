"""Per-stage memory of the planner: interleaving's extra micro-batches, unequal chunks, gradient bytes."""

import dataclasses

import pytest

from utils.parallel.model.activations import interleave_factor
from utils.parallel.memory import zero_model_state_breakdown, zero_model_state_bytes
from utils.parallel.model.pipeline import peak_in_flight, schedule
from utils.parallel.planning.planner import Layout, plan, step_time
from utils.parallel.planning.published_runs import LLAMA3_RUNS, MEGATRON_RUNS
from utils.parallel.model.stage_memory import chunk_layers, peak_layers_in_flight, stage_memory
from utils.parallel.planning.transformer_costs import Model
from utils.published import Published

GB = 1e9

MEGATRON_DOCS_BF16_FP32_GRADS = Published(18, "bytes per parameter, bf16 params and fp32 grads, no distributed "
                                          "optimizer", "Megatron-LM docs, distributed optimizer")
ZERO_FP16_RECIPE = Published(16, "bytes per parameter, mixed-precision Adam (2 + 2 + 12)",
                             "Rajbhandari et al., arXiv:1910.02054, section 3.1")


@pytest.mark.parametrize("p, m, v", [(4, 8, 2), (4, 4, 2), (8, 24, 3), (16, 32, 4), (16, 16, 4), (16, 32, 8)])
def test_layers_in_flight_match_the_simulator_and_the_interleave_factor(p, m, v):
    # Equal chunks of 2 layers: the planner's count is the simulator's chunks in flight x 2, on every stage.
    model = Model(layers=2 * p * v, hidden=1024, heads=8, vocab=1000, seq_len=128)
    layout = Layout(dp=1, tp=1, pp=p, micro_batch=1, global_batch=m, v=v)
    simulated = peak_in_flight(schedule("interleaved", p, m, v))
    assert [peak_layers_in_flight(model, layout, r) for r in range(p)] == [2 * c for c in simulated]
    # The first stage: Korthikanti's 1 + (p - 1)/(pv) times 1F1B's L layers once m >= 2p; m = p holds no extra.
    factor = interleave_factor(p, v) if m >= 2 * p else 1.0
    assert peak_layers_in_flight(model, layout, 0) == pytest.approx(model.layers * factor)


def test_the_issue_s_79_chunks_for_llama_3_with_v_4():
    run = LLAMA3_RUNS[0]  # 8,192 GPUs: p = 16, m = 32
    layout = dataclasses.replace(run.layout, v=4)
    assert peak_in_flight(schedule("interleaved", 16, 32, 4))[0] == 79
    # 79 chunks of 2 slots; 31 of them are chunk 0, whose embedding takes one slot: 79 x 2 - 31 layers.
    assert chunk_layers(run.model, layout, 0) == [1, 2, 2, 2]
    assert peak_layers_in_flight(run.model, layout, 0) == 79 * 2 - 31


def test_llama_3_embedding_only_chunk_cancels_the_first_stage_excess():
    # v = 8: the first chunk of the first stage has only the embedding (Llama 3, section 3.3.2), so its extra
    # p - 1 warm-up chunks hold no layer: exactly 1F1B's 16 micro-batches of 7 layers. Stage 1 still holds
    # 2p - 1 - 2 = 13 extra layer-micro-batches and becomes the fullest.
    run = LLAMA3_RUNS[0]
    assert chunk_layers(run.model, run.layout, 0) == [0] + [1] * 7
    assert peak_layers_in_flight(run.model, run.layout, 0) == 16 * 7
    assert peak_layers_in_flight(run.model, run.layout, 1) == 16 * 8 + 13
    p = plan(run.model, run.cluster, run.layout)
    assert p.stage == 1
    assert p.memory == stage_memory(run.model, run.layout, 1)


def test_llama_3_8k_gpu_row_does_not_fit_with_a_gpt_layer_s_activations():
    # The honest result: 141 layer-micro-batches x 34 sbh/t bytes overflow 80 GB; the chapter says why the real
    # run fits. With m = p (16,384 GPUs) every forward runs before the first backward: no interleaving excess.
    eight, sixteen = (plan(r.model, r.cluster, r.layout) for r in LLAMA3_RUNS)
    assert not eight.fits and 85 * GB < eight.memory_bytes < 90 * GB
    assert peak_layers_in_flight(LLAMA3_RUNS[1].model, LLAMA3_RUNS[1].layout, 1) == 16 * 8
    assert sixteen.memory_bytes < eight.memory_bytes


def test_gradient_bytes_default_to_the_zero_recipe_and_take_fp32():
    assert zero_model_state_bytes(1.0, 1, 0) == ZERO_FP16_RECIPE.value
    assert zero_model_state_breakdown(1.0, 1, 0, grad_bytes_per_param=4).total == MEGATRON_DOCS_BF16_FP32_GRADS.value
    run = LLAMA3_RUNS[0]
    assert run.layout.grad_bytes == 4 and all(r.layout.grad_bytes == 2 for r in MEGATRON_RUNS)
    fp16 = stage_memory(run.model, dataclasses.replace(run.layout, grad_bytes=2), 1)
    fp32 = stage_memory(run.model, run.layout, 1)
    assert fp32["gradients"] == pytest.approx(2 * fp16["gradients"])
    slow = step_time(run.model, run.cluster, run.layout)["DP communication (exposed)"]
    fast = step_time(run.model, run.cluster, dataclasses.replace(run.layout, grad_bytes=2))
    assert slow > fast["DP communication (exposed)"]
