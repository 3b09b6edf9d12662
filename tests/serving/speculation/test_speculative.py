import itertools

import pytest
import torch

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.serving.speculation.goodness_of_fit import chi_square_critical, chi_square_statistic
from utils.serving.speculation.speculative import (accept_draft, expected_acceptance, expected_speedup, expected_tokens_per_step,
                                       optimal_k, probabilities, simulate_tokens_per_step, speculative_generate)


def random_dist(g, *shape, sparsity=0.0):
    logits = torch.randn(*shape, generator=g, dtype=torch.float64) * 1.5
    if sparsity:
        logits = logits.masked_fill(torch.rand(*shape, generator=g) < sparsity, float("-inf"))
        logits[..., 0] = logits[..., 0].clamp_min(0.0)  # keep every row a distribution
    return logits.softmax(-1)


@pytest.fixture(scope="module")
def models():
    """A random target and, as its draft, a copy with noisy weights: they agree often, not always."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab=48, dim=32, n_layers=2, n_heads=4, n_kv_heads=2)
    target, draft = TinyLlama(config).eval(), TinyLlama(config).eval()
    with torch.no_grad():
        for (name, w), (_, w_draft) in zip(target.named_parameters(), draft.named_parameters()):
            if name == "out.weight":
                w.mul_(8)  # confident predictions, as a trained model makes
            w_draft.copy_(w + 0.3 * w.std() * torch.randn_like(w))
    return target, draft


@pytest.mark.parametrize("k", [0, 1, 2, 4, 7])
@pytest.mark.parametrize("prompt_len", [1, 5])
def test_greedy_equals_target_generate(models, k, prompt_len):
    target, draft = models
    prompt = torch.randint(0, 48, (1, prompt_len), generator=torch.Generator().manual_seed(prompt_len))
    result = speculative_generate(target, draft, prompt, 25, k)
    assert torch.equal(result.tokens, target.generate(prompt, 25))
    assert sum(a + 1 for a in result.accepted) == 25 and len(result.accepted) == result.target_calls
    assert all(0 <= a <= d <= k for a, d in zip(result.accepted, result.drafted))


def test_draft_equal_to_target_accepts_everything(models):
    target, _ = models
    result = speculative_generate(target, target, torch.tensor([3, 1, 4]), 22, 4)
    assert result.accepted == [4, 4, 4, 4, 1] and result.drafted == [4, 4, 4, 4, 1]  # the last step fits 2 tokens
    assert result.acceptance_rate == 1 and result.tokens_per_step == 22 / 5


def test_greedy_acceptance_is_argmax_agreement(models):
    """In greedy mode a draft token is kept iff it is the target's argmax given the committed prefix."""
    target, draft = models
    prompt = torch.tensor([[5, 9, 2]])
    result = speculative_generate(target, draft, prompt, 30, 1)
    with torch.no_grad():
        text = result.tokens[:, :-1]
        agree = (target(text).argmax(-1) == draft(text).argmax(-1))[0, prompt.shape[1] - 1:]
    # with k = 1 every step drafts one token at the committed prefix, except the last (k shrinks to fit)
    starts = [prompt.shape[1] - 1]
    for a in result.accepted[:-1]:
        starts.append(starts[-1] + a + 1)
    assert result.accepted[:-1] == [int(agree[s - prompt.shape[1] + 1]) for s in starts[:-1]]
    assert 0 < result.acceptance_rate < 1


def exact_first_token_distribution(p0, q0):
    """Enumerate the draft token x ~ q0; accept with min(1, p/q), else draw from the normalised residual."""
    residual = (p0 - q0).clamp_min(0)
    out = torch.zeros_like(p0)
    for x in range(len(q0)):
        if q0[x] == 0:
            continue
        keep = min(1.0, float(p0[x] / q0[x]))
        out[x] += q0[x] * keep
        out += q0[x] * (1 - keep) * residual / residual.sum() if residual.sum() > 0 else 0
    return out


@pytest.mark.parametrize("seed", range(5))
def test_enumerated_first_token_distribution_is_p(seed):
    g = torch.Generator().manual_seed(seed)
    p0, q0 = random_dist(g, 6, sparsity=0.3 * (seed % 2)), random_dist(g, 6, sparsity=0.3)
    torch.testing.assert_close(exact_first_token_distribution(p0, q0), p0, atol=1e-12, rtol=0)


def test_accept_draft_first_token_matches_p_chi_square():
    """Seeded: 40,000 draws of x ~ q, then accept_draft; the first emitted token must pass a chi-square test
    at significance 1e-3 against p, and fail it against q (the test has power)."""
    g = torch.Generator().manual_seed(1)
    p, q = random_dist(g, 3, 8), random_dist(g, 2, 8)
    n = 40_000
    counts = torch.zeros(8)
    second = torch.zeros(8)
    for x in torch.multinomial(q[0], n, replacement=True, generator=g).tolist():
        x2 = int(torch.multinomial(q[1], 1, generator=g))
        out = accept_draft(p, q, [x, x2], g)
        counts[out[0]] += 1
        if out[0] == x and len(out) > 1:  # draft x kept: the next token must follow p[1]
            second[out[1]] += 1
    for observed, probs in ((counts, p[0]), (second, p[1])):
        stat, dof = chi_square_statistic(observed, probs)
        assert stat < chi_square_critical(dof, 1e-3)
    stat, dof = chi_square_statistic(counts, q[0])
    assert stat > chi_square_critical(dof, 1e-3)


@pytest.fixture(scope="module")
def spread_models():
    """A target whose next-token law is spread (entropy about 2.6 nats at the test's prompt) and, as its draft,
    another random model: total variation about 0.65 from the target. The fixture ``models`` is too confident
    (its law is one token) and its draft too near (TV 0.0002) for a wrong sampler to show."""
    config = LlamaConfig(vocab=48, dim=32, n_layers=2, n_heads=4, n_kv_heads=2)
    torch.manual_seed(0)
    target = TinyLlama(config).eval()
    torch.manual_seed(2)
    draft = TinyLlama(config).eval()
    with torch.no_grad():
        target.out.weight.mul_(2)
        draft.out.weight.mul_(2)
    return target, draft


def _emit_every_draft(p, q, draft_tokens, generator=None):
    """Mutant: keeps every proposal (no acceptance test), then samples the bonus token from p."""
    return [int(t) for t in draft_tokens] + [int(torch.multinomial(p[len(draft_tokens)], 1, generator=generator))]


def _resample_from_p(p, q, draft_tokens, generator=None):
    """Mutant: the right acceptance test, but a rejection resamples from p instead of norm(max(0, p - q))."""
    out = []
    for i, x in enumerate(int(t) for t in draft_tokens):
        if float(torch.rand((), generator=generator, dtype=torch.float64)) * float(q[i, x]) < float(p[i, x]):
            out.append(x)
            continue
        return out + [int(torch.multinomial(p[i], 1, generator=generator))]
    return out + [int(torch.multinomial(p[len(draft_tokens)], 1, generator=generator))]


def _two_token_statistic(target, draft, runs, seed=0):
    """Chi-square of ``runs`` two-token samples (temperature 1, k = 3) against the target's joint law over 48 x 48 pairs."""
    prompt = torch.tensor([[7, 3]])
    with torch.no_grad():
        p1 = target(prompt)[0, -1].double().softmax(-1)
        pairs = torch.cat([prompt.repeat(48, 1), torch.arange(48)[:, None]], 1)
        p2 = target(pairs)[:, -1].double().softmax(-1)
    joint = (p1[:, None] * p2).flatten()
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(48 * 48)
    for _ in range(runs):
        out = speculative_generate(target, draft, prompt, 2, 3, temperature=1.0, generator=g).tokens[0, -2:]
        counts[48 * int(out[0]) + int(out[1])] += 1
    stat, dof = chi_square_statistic(counts, joint)
    return stat, chi_square_critical(dof, 1e-3)


def test_sampled_sequences_follow_the_target(spread_models, monkeypatch):
    """Two sampled tokens: their joint law equals the target's (chi-square at 1e-3). The test has power: the
    same test rejects a sampler that keeps every proposal and one that resamples a rejection from p instead of
    norm(max(0, p - q)); the draft is far from the target and the target's law spread, so that both show."""
    target, draft = spread_models
    with torch.no_grad():
        prompt = torch.tensor([[7, 3]])
        p1, q1 = (m(prompt)[0, -1].double().softmax(-1) for m in (target, draft))
    beta = torch.minimum(p1, q1)
    assert 0.5 * float((p1 - q1).abs().sum()) > 0.5, "the draft must be far: total variation above 0.5"
    assert 0.5 * float((beta + (1 - beta.sum()) * p1 - p1).abs().sum()) > 0.15, \
        "resampling from p must move the first token's law by a total variation above 0.15"
    stat, critical = _two_token_statistic(target, draft, 1500)
    assert stat < critical
    for mutant in (_emit_every_draft, _resample_from_p):
        monkeypatch.setattr("utils.serving.speculation.speculative.accept_draft", mutant)
        stat, critical = _two_token_statistic(target, draft, 1000, seed=1)
        assert stat > critical, f"{mutant.__name__}: the chi-square test did not reject it"


def test_greedy_rule_is_one_hot_special_case():
    p = probabilities(torch.tensor([[0.1, 2.0, 0.3], [1.0, 0.0, 0.5], [0.0, 0.0, 3.0]]), 0.0)
    q = probabilities(torch.tensor([[0.0, 5.0, 0.0], [0.0, 0.0, 5.0]]), 0.0)
    for seed in range(10):  # deterministic whatever the random numbers
        assert accept_draft(p, q, [1, 2], torch.Generator().manual_seed(seed)) == [1, 0]
        assert accept_draft(p[:2], q[:1], [1], torch.Generator().manual_seed(seed)) == [1, 0]


def test_expected_tokens_formula_against_simulation():
    g = torch.Generator().manual_seed(0)
    for alpha, k in itertools.product([0.0, 0.3, 0.6, 0.8, 0.95, 1.0], [0, 1, 3, 6]):
        exact = expected_tokens_per_step(alpha, k)
        direct = sum(alpha ** i for i in range(k + 1))  # 1 + alpha + ... + alpha^k
        assert exact == pytest.approx(direct, rel=1e-12)
        n = 200_000
        sim = simulate_tokens_per_step(alpha, k, n, g)
        # the step's token count lies in [1, k+1]: its standard deviation is at most k/2; 5 sigma
        assert abs(sim - exact) <= 5 * (k / 2) / n ** 0.5 + 1e-12


def test_accept_draft_tokens_per_step_matches_formula_for_iid_acceptance():
    """Rows where every draft token is accepted with the same probability beta = sum min(p, q)."""
    g = torch.Generator().manual_seed(3)
    p0, q0 = random_dist(g, 10), random_dist(g, 10)
    beta = float(expected_acceptance(p0, q0))
    k, n = 4, 20_000
    p, q = p0.repeat(k + 1, 1), q0.repeat(k, 1)
    lengths = [len(accept_draft(p, q, torch.multinomial(q0, k, replacement=True, generator=g), g)) for _ in range(n)]
    assert sum(lengths) / n == pytest.approx(expected_tokens_per_step(beta, k), abs=5 * 2 / n ** 0.5)


def test_speedup_and_optimal_k():
    assert expected_speedup(0.8, 4, 0.0) == pytest.approx((1 - 0.8 ** 5) / 0.2)
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 1.2))
    assert expected_speedup(0.0, 0, 0.3) == 1.0
    assert optimal_k(0.0, 0.1) == 0 and optimal_k(0.9, 0.0, k_max=12) == 12
    k = optimal_k(0.8, 0.05)
    assert all(expected_speedup(0.8, k, 0.05) >= expected_speedup(0.8, j, 0.05) for j in range(33))
    assert 1 < k < 32


@pytest.mark.parametrize("args, match", [
    ((torch.full((2, 4), 0.25), torch.full((2, 4), 0.25), [0, 1]), "k\\+1"),
    ((torch.full((3, 4), 0.25), torch.full((2, 5), 0.2), [0, 1]), "k\\+1"),
    ((torch.full((3, 4), 0.25), torch.full((2, 4), 0.25), [0]), "k = 2"),
    ((torch.full((3, 4), 0.25), torch.full((2, 4), 0.25), [0, 4]), "outside"),
    ((torch.full((3, 4), 0.3), torch.full((2, 4), 0.25), [0, 1]), "sum to 1"),
    ((torch.full((3, 4), 0.25), torch.tensor([[0.5, 0.5, 0, 0], [0.25] * 4]), [2, 1]), "probability 0"),
    ((torch.full((3, 4), 0.25), torch.tensor([[1.5, -0.5, 0, 0], [0.25] * 4]), [0, 1]), "non-negative"),
    ((torch.full((4,), 0.25), torch.full((2, 4), 0.25), [0, 1]), "2-D"),
])
def test_accept_draft_rejects_bad_inputs(args, match):
    with pytest.raises(ValueError, match=match):
        accept_draft(*args)


def test_speculative_generate_rejects_bad_inputs(models):
    target, draft = models
    other = TinyLlama(LlamaConfig(vocab=16, dim=16, n_layers=1, n_heads=2, n_kv_heads=2))
    for kwargs, match in (({"n_new": 0, "k": 2}, "n_new"), ({"n_new": 3, "k": -1}, "k"),
                          ({"n_new": 3, "k": 2, "temperature": -1.0}, "temperature")):
        with pytest.raises(ValueError, match=match):
            speculative_generate(target, draft, torch.tensor([[1, 2]]), **kwargs)
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(target, other, torch.tensor([[1, 2]]), 3, 2)
    with pytest.raises(ValueError, match="one sequence"):
        speculative_generate(target, draft, torch.tensor([[1, 2], [3, 4]]), 3, 2)
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens_per_step(1.5, 3)


def test_verify_step_cost_by_hand():
    from utils.serving.speculation.speculative import verify_step_cost
    from utils.serving.costs.step_time import ServedModel, step_cost

    # N = 1000 parameters in 2000 bytes, 100 cache bytes and 3 attention FLOPs per attended token
    tiny = ServedModel("tiny", 1000, 2000, 2500, 100.0, 3.0, 3.0)
    cost = verify_step_cost(tiny, batch=2, context=10, k=3)
    assert cost.tokens == 2 * 4
    assert (cost.linear.flops, cost.linear.nbytes) == (2 * 1000 * 2 * 4, 2000)  # weights read once per pass
    assert (cost.attention.flops, cost.attention.nbytes) == (3.0 * 2 * 4 * 10, 100 * 2 * 10)  # each cache once
    assert verify_step_cost(tiny, 2, 10, 0) == step_cost(tiny, [10, 10])  # k = 0: a plain decode step
    with pytest.raises(ValueError, match="k"):
        verify_step_cost(tiny, 2, 10, -1)


def test_verify_pass_costs_one_decode_step_while_memory_bound():
    from utils.serving.speculation.speculative import roofline_speedup, verify_step_cost
    from utils.serving.costs.step_time import Roof, served_model, step_seconds

    llama, roof = served_model("Llama-3-8B"), Roof.of("H100-SXM", "bf16")
    one, five = verify_step_cost(llama, 1, 2048, 0), verify_step_cost(llama, 1, 2048, 4)
    assert five.total.nbytes == one.total.nbytes and five.total.flops == pytest.approx(5 * one.total.flops)
    assert step_seconds(five, roof) == step_seconds(one, roof)
    assert roofline_speedup(0.8, 4, 0.05, llama, 1, 2048, roof) == pytest.approx(expected_speedup(0.8, 4, 0.05))
    # no cache: B (k+1) tokens at ~1 FLOP/byte each meet the H100's ridge (~295) near B = 59, and the gain
    # falls below 1 once t_verify > 3.16 t_decode, i.e. 5 B / 295 > 3.16: B > 187
    assert roofline_speedup(0.8, 4, 0.05, llama, 50, 0, roof) == pytest.approx(expected_speedup(0.8, 4, 0.05))
    assert roofline_speedup(0.8, 4, 0.05, llama, 180, 0, roof) > 1 > roofline_speedup(0.8, 4, 0.05, llama, 195, 0,
                                                                                        roof)
    with pytest.raises(ValueError, match="Roof"):
        roofline_speedup(0.8, 4, 0.05, llama, 1, 0, "H100-SXM")


def test_roofline_speedup_prices_the_two_kernels_separately_by_hand():
    """Llama-3-8B, 2,048 cached tokens, batch 128, k = 4 on an H100 in bf16: the weight matmuls of the verify
    pass are compute-bound (640 tokens, past the ridge), attention is memory-bound in both passes. The sum of
    the two gives 2.16x; the single max over the step (perfect overlap) would hide the matmuls behind the
    caches' bytes and give Leviathan's 2.80x."""
    from utils.attention.decode_cost import params_read_per_step
    from utils.serving.speculation.speculative import roofline_speedup
    from utils.serving.costs.step_time import Roof, served_model

    n, peak, bandwidth = params_read_per_step("Llama-3-8B"), 989.4e12, 3.35e12
    cache = 2 * 32 * 8 * 128 * 2  # bytes per cached token: K and V, 32 layers, 8 KV heads of 128, bf16
    batch, context = 128, 2048
    t_attention = batch * context * cache / bandwidth  # 10.26 ms, the same in both passes
    t_decode = 2 * n / bandwidth + t_attention  # weights memory-bound: 4.48 ms
    t_verify = 2 * n * batch * 5 / peak + t_attention  # 640 tokens through the weights: 9.71 ms of FLOPs
    by_hand = expected_tokens_per_step(0.8, 4) * t_decode / (t_verify + 4 * 0.05 * t_decode)
    llama, roof = served_model("Llama-3-8B"), Roof.of("H100-SXM", "bf16")
    assert roofline_speedup(0.8, 4, 0.05, llama, batch, context, roof) == pytest.approx(by_hand, rel=1e-12)
    assert by_hand == pytest.approx(2.162, abs=1e-3)
    # the perfect-overlap max, kept only to compare the two models: the 2.80x of the free verify pass
    assert roofline_speedup(0.8, 4, 0.05, llama, batch, context, roof, overlap=True) == pytest.approx(
        expected_speedup(0.8, 4, 0.05))
    # where the caches fill 80 GB (238 sequences of 2,048 tokens) the gain is down to about 1.9x
    assert roofline_speedup(0.8, 4, 0.05, llama, 238, context, roof) == pytest.approx(1.89, abs=0.01)


def test_result_records_the_proposals(models):
    target, draft = models
    result = speculative_generate(target, draft, torch.tensor([[4, 4, 1]]), 20, 3)
    assert [len(p) for p in result.proposals] == result.drafted
    position = 3
    for proposal, kept in zip(result.proposals, result.accepted):
        assert result.tokens[0, position: position + kept].tolist() == proposal[:kept]
        position += kept + 1
