import pytest
import torch

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.serving.runtime.engine import Engine
from utils.serving.costs.trace import TimedRequest, poisson_trace, replay_in_seconds, replay_in_steps


def test_poisson_gaps_have_mean_one_over_rate():
    trace = poisson_trace(4000, rate=2.0, prompt_len=(3, 5), output_len=(1, 2), vocab=10, seed=0)
    gaps = torch.tensor([b.arrival - a.arrival for a, b in zip(trace, trace[1:])])
    assert trace[0].arrival == 0
    assert abs(gaps.mean().item() - 0.5) < 0.03  # the sample mean's standard error is 0.5 / sqrt(4000) = 0.008
    assert abs(gaps.std().item() - 0.5) < 0.03   # exponential: standard deviation = mean
    assert all(3 <= len(r.prompt) <= 5 and 1 <= r.max_new_tokens <= 2 for r in trace)
    assert trace == poisson_trace(4000, rate=2.0, prompt_len=(3, 5), output_len=(1, 2), vocab=10, seed=0)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TinyLlama(LlamaConfig(vocab=32, dim=16, n_layers=1, n_heads=2, n_kv_heads=1)).double().eval()


def test_step_replay_admits_at_arrival_steps_and_jumps_idle_time(model):
    trace = [TimedRequest(0, (1, 2), 3), TimedRequest(1, (3,), 2), TimedRequest(50, (4, 5), 2)]
    engine = Engine(model, num_blocks=8, block_size=4, max_num_batched_tokens=16)
    ids = replay_in_steps(engine, trace)
    stats = engine.stats().requests
    assert [stats[i].ttft_steps for i in ids] == [1, 1, 1]  # each is prefilled in the step after it arrives
    assert engine.stats().steps == 3 + 2  # requests 0 and 1 overlap (3 steps), request 2 alone (2 steps)


def test_second_replay_counts_the_wait_for_a_running_step(model):
    ticks = iter(float(t) for t in range(10_000))
    engine = Engine(model, num_blocks=8, block_size=4, max_num_batched_tokens=16, clock=lambda: next(ticks))
    slept = []
    ids = replay_in_seconds(engine, [TimedRequest(0.0, (1, 2), 2), TimedRequest(100.0, (3,), 2)],
                            sleep=slept.append)
    assert len(ids) == 2 and slept and all(s > 0 for s in slept)
    assert all(r.ttft_seconds > 0 for r in engine.stats().requests.values())


def test_bad_traces_are_refused(model):
    with pytest.raises(ValueError, match="prompt_len"):
        poisson_trace(3, 1.0, (0, 2), (1, 1), vocab=4)
    engine = Engine(model, num_blocks=8, block_size=4, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match="must not decrease"):
        replay_in_steps(engine, [TimedRequest(2, (1,), 1), TimedRequest(1, (1,), 1)])
    with pytest.raises(ValueError, match="arrival must lie"):
        engine.add_request([1], 1, arrival=1e9)
