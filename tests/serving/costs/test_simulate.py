import pytest
import torch

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.serving.runtime.engine import Engine
from utils.serving.costs.simulate import simulate
from utils.serving.costs.step_time import Roof, decode_step_seconds, prefill_seconds, served_model
from utils.serving.costs.trace import TimedRequest, poisson_trace, replay_in_steps

LLAMA = served_model("Llama-3-8B")
H100 = Roof.of("H100-SXM")


@pytest.mark.parametrize("kwargs", [dict(num_blocks=64, max_num_batched_tokens=32),
                                    dict(num_blocks=10, max_num_batched_tokens=16, prefix_caching=True),
                                    dict(num_blocks=64, max_num_batched_tokens=64, policy="static",
                                         max_num_seqs=3)])
def test_the_schedule_is_the_engines(kwargs):
    torch.manual_seed(0)
    model = TinyLlama(LlamaConfig(vocab=32, dim=16, n_layers=1, n_heads=2, n_kv_heads=1)).double().eval()
    trace = poisson_trace(12, rate=0.5, prompt_len=(1, 20), output_len=(1, 10), vocab=32, seed=1)
    engine = Engine(model, block_size=4, **kwargs)
    replay_in_steps(engine, [TimedRequest(0, r.prompt, r.max_new_tokens) for r in trace])
    run = simulate([TimedRequest(0.0, r.prompt, r.max_new_tokens) for r in trace], LLAMA, H100, block_size=4,
                   **kwargs)
    assert run.schedule == engine.stats().schedule
    assert run.preemptions == engine.stats().preemptions


def test_a_lone_request_costs_one_prefill_then_decode_steps():
    run = simulate([TimedRequest(0.0, tuple(range(100)), 4)], LLAMA, H100, num_blocks=64, block_size=16,
                   max_num_batched_tokens=512)
    times = run.requests[0].token_times
    assert times[0] == pytest.approx(prefill_seconds(LLAMA, 100, H100))
    for j in range(1, 4):
        assert times[j] - times[j - 1] == pytest.approx(decode_step_seconds(LLAMA, 1, 100 + j, H100))


def test_idle_time_jumps_to_the_next_arrival():
    trace = [TimedRequest(0.0, (1, 2), 1), TimedRequest(5.0, (3, 4), 1)]
    run = simulate(trace, LLAMA, H100, num_blocks=8, block_size=4, max_num_batched_tokens=8)
    assert run.requests[1].token_times[0] == pytest.approx(5.0 + prefill_seconds(LLAMA, 2, H100))


def test_chunking_bounds_the_stall_of_decoding_requests():
    decoding = [TimedRequest(0.0, (1,) * 64, 60) for _ in range(16)]
    long_prompt = [TimedRequest(0.005, (2,) * 8192, 2)]
    gaps = {}
    for budget, chunked in ((16384, False), (512, True)):
        run = simulate(decoding + long_prompt, LLAMA, H100, num_blocks=4096, block_size=16,
                       max_num_batched_tokens=budget, chunked_prefill=chunked)
        gaps[budget] = max(b - a for r in run.requests[:16] for a, b in zip(r.token_times, r.token_times[1:]))
    assert gaps[512] < gaps[16384] / 3


def test_impossible_requests_are_refused():
    with pytest.raises(ValueError, match="cannot fit"):
        simulate([TimedRequest(0.0, (1,) * 40, 1)], LLAMA, H100, num_blocks=2, block_size=16,
                 max_num_batched_tokens=64)
