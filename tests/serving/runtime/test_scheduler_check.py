"""utils.serving.runtime.scheduler_check: the reference passes; bugs planted in a copy of it fail, with the hint naming them.

Each mutant is the reference Scheduler's source with one line changed, defined beside it: mistakes part 5 lab
1's reader makes, and two that passed the lab's old checks (every full block hashed, which crashes on a repeated
prompt, and a queued request holding its cache hits, which deadlocks a small pool).
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch

import utils.serving.runtime.scheduler as reference
import utils.serving.runtime.scheduler_check as check
from utils.attention.llama import LlamaConfig, TinyLlama
from utils.hints import MISTAKES, CheckFailed
from utils.serving.runtime.scheduler_check import check_scheduler, engine_with

BLOCK = 8


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TinyLlama(LlamaConfig(vocab=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2)).double().eval()


def greedy(model, prompt, n_new):
    return model.generate(torch.tensor([prompt]), n_new)[0, len(prompt):].tolist()


def workload(model, n, seed, prompt_len=(1, 40), shared=()):
    g = torch.Generator().manual_seed(seed)
    requests = []
    for _ in range(n):
        size = int(torch.randint(prompt_len[0], prompt_len[1] + 1, (1,), generator=g))
        prompt = list(shared) + torch.randint(0, 256, (size,), generator=g).tolist()
        requests.append((prompt, int(torch.randint(2, 9, (1,), generator=g))))
    return requests, [greedy(model, p, k) for p, k in requests]


def few_shot(model):
    shared = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(7)).tolist()
    return workload(model, 8, seed=2, prompt_len=(1, 12), shared=shared)


def repeated(model):
    prompt = torch.randint(0, 256, (72,), generator=torch.Generator().manual_seed(8)).tolist()
    return [(prompt, 4)] * 3, [greedy(model, prompt, 4)] * 3


def mutant(old: str, new: str) -> type:
    """The reference Scheduler with ``old`` replaced by ``new`` in its source, defined beside the reference."""
    source = inspect.getsource(reference.Scheduler)
    assert source.count(old) == 1, f"the planted line is no longer in the reference: {old!r}"
    namespace = dict(vars(reference))
    exec(compile(source.replace(old, new), "planted_scheduler.py", "exec"), namespace)
    return namespace["Scheduler"]


def failure(scheduler_cls, model, requests, expected, **config) -> str:
    with pytest.raises(CheckFailed) as info:
        check_scheduler(scheduler_cls, model, requests, expected, case="planted", **config)
    return str(info.value)


SMALL = dict(num_blocks=11, budget=96, max_num_seqs=4, prefix_caching=True)


@pytest.mark.parametrize("config", [dict(), dict(max_num_seqs=3), dict(budget=8), dict(num_blocks=7),
                                    dict(num_blocks=7, budget=8)])
def test_the_reference_passes_and_returns_greedy_outputs(model, config):
    requests, expected = workload(model, 10, seed=1)
    outputs, stats = check_scheduler(reference.Scheduler, model, requests, expected, case="ref", **config)
    assert outputs == expected and stats.steps > 0
    if config.get("num_blocks") == 7:
        assert stats.preemptions > 0  # the case exercises preemption


@pytest.mark.parametrize("maker, config", [(few_shot, dict(budget=96, max_num_seqs=4, prefix_caching=True)),
                                           (repeated, dict(budget=96, max_num_seqs=1, prefix_caching=True)),
                                           (few_shot, SMALL)])
def test_the_reference_passes_with_prefix_caching(model, maker, config):
    requests, expected = maker(model)
    _, stats = check_scheduler(reference.Scheduler, model, requests, expected, case="ref", **config)
    assert stats.prefix_hit_tokens > 0


def test_hashing_every_full_block_is_caught_on_a_repeated_prompt(model):
    planted = mutant("usable = (len(tokens) - 1) // self.block_size", "usable = len(tokens) // self.block_size")
    requests, expected = repeated(model)
    message = failure(planted, model, requests, expected, budget=96, max_num_seqs=1, prefix_caching=True)
    assert "r1 was scheduled with 0 tokens: all 72 of its tokens were taken from the cache" in message
    assert MISTAKES["serving-prefix-last-token"]["some"] in message


def test_holding_the_hits_of_a_request_that_does_not_fit_is_caught_before_the_deadlock(model):
    planted = mutant("                self._release_cached_prefix(request)\n                break",
                     "                break")
    requests, expected = few_shot(model)
    engine = engine_with(model, planted, 11, BLOCK, 96, max_num_seqs=4, prefix_caching=True)
    for prompt, n in requests:
        engine.add_request(prompt, n)
    with pytest.raises(RuntimeError, match="no request could be scheduled"):  # unchecked, the pool runs dry
        engine.run()
    message = failure(planted, model, requests, expected, **SMALL)
    assert "is still waiting but holds 8 blocks" in message
    assert MISTAKES["serving-prefix-release"]["some"] in message


def test_never_looking_up_the_prefix_is_named(model):
    planted = mutant("            self._take_cached_prefix(request)\n", "")
    requests, expected = few_shot(model)
    message = failure(planted, model, requests, expected, budget=96, max_num_seqs=4, prefix_caching=True)
    assert "found in the prefix cache" in message
    assert MISTAKES["serving-prefix-lookup"]["some"] in message


class NeverLooksUp(reference.Scheduler):
    def take_cached_prefix(self, request):  # the reader's hook, which the reference's schedule() never calls
        pass


def test_a_schedule_that_never_calls_the_lookup_fails_already_without_caching(model):
    requests, expected = workload(model, 4, seed=1)
    message = failure(NeverLooksUp, model, requests, expected)
    assert message.startswith("planted: step 1: you admitted r0 without calling self.take_cached_prefix")
    assert MISTAKES["serving-prefix-lookup"]["some"] in message


def test_forgetting_max_num_seqs_fails_at_the_first_step(model):
    planted = mutant("            if self.max_num_seqs is not None and len(self.running) >= self.max_num_seqs:\n"
                     "                break\n", "")
    requests, expected = workload(model, 10, seed=1)
    message = failure(planted, model, requests, expected, max_num_seqs=3)
    assert message.startswith("planted: step 1: ") and "but max_num_seqs = 3" in message
    assert MISTAKES["serving-scheduler-max-seqs"]["some"] in message


def test_preempting_the_wrong_request_names_both_victims(model):
    planted = mutant("victim = self.running[-1]", "victim = self.running[0]")
    requests, expected = workload(model, 10, seed=1)
    message = failure(planted, model, requests, expected, num_blocks=7)
    assert "yours ran:" in message and "reference ran:" in message and "preempted" in message
    assert MISTAKES["serving-scheduler-preemption"]["some"] in message


def test_admitting_in_a_step_that_preempted_is_named(model):
    planted = mutant("        if preempted or (self.policy", "        if (self.policy")
    requests, expected = workload(model, 10, seed=1)
    message = failure(planted, model, requests, expected, num_blocks=7, budget=8)
    assert MISTAKES["serving-scheduler-admission"]["some"] in message


class Stalls(reference.Scheduler):
    def schedule(self):
        return []


class Raises(reference.Scheduler):
    def schedule(self):
        raise KeyError("oops")


def test_a_scheduler_that_stalls_fails_at_once_instead_of_hanging(model):
    requests, expected = workload(model, 4, seed=1)
    message = failure(Stalls, model, requests, expected)
    assert message.startswith("planted: step 1: ") and "you did not" in message


def test_an_error_in_the_readers_schedule_keeps_its_traceback(model):
    requests, expected = workload(model, 4, seed=1)
    with pytest.raises(CheckFailed, match="your schedule\\(\\) raised KeyError") as info:
        check_scheduler(Raises, model, requests, expected, case="planted")
    assert isinstance(info.value.__cause__, KeyError)


def test_a_wrong_expected_output_is_reported_against_greedy(model):
    requests, expected = workload(model, 4, seed=1)
    wrong = [list(e) for e in expected]
    wrong[2][0] += 1
    with pytest.raises(CheckFailed, match="r2's output differs from greedy decoding at token 0"):
        check_scheduler(reference.Scheduler, model, requests, wrong, case="planted")


def test_every_rule_the_check_names_has_a_table():
    rules = set(re.findall(r'"(serving-(?:scheduler|prefix)-[a-z-]+)"', inspect.getsource(check)))
    assert len(rules) >= 8 and all(MISTAKES[rule]["some"] for rule in rules)
