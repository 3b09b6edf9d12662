"""Checks of the lab "GRPO with your own engine": the engine's draw, the truncated-importance GRPO loss, and a
group's rollouts admitted so that the siblings hit the prefix cache.

The references are :func:`utils.serving.runtime.sampling.draw`, :func:`utils.capstone.grpo_engine.tis_grpo_loss`
and one request alone (:func:`utils.serving.runtime.sampling.sample_reference`) with the cache rule of
:func:`utils.capstone.engine_rollouts.expected_hit_rate`. Each check raises :class:`~utils.hints.CheckFailed`
naming the first thing that differs and what that usually means (:data:`HINTS`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from utils.attention.llama import TinyLlama
from utils.capstone.engine_rollouts import CONFIG, expected_hit_rate, new_engine
from utils.capstone.grpo_engine import tis_grpo_loss
from utils.hints import CheckFailed
from utils.rl.objectives import kl_estimate
from utils.rl.post_training import grpo_loss
from utils.rl.tiny_lm import END, MAX_RESPONSE, PROMPT_LEN, all_prompts, prompt_tokens
from utils.serving.runtime.sampling import draw, sample_reference
from utils.serving.speculation.goodness_of_fit import chi_square_critical, chi_square_statistic

__all__ = ["HINTS", "check_draw", "check_group_rollouts", "check_tis_loss"]

HINTS = {
    "greedy": "at temperature 0 the token is the argmax of the logits (no random number is drawn).",
    "pair": "return a pair (token, log-prob): an int and a float.",
    "logprob at T": "the log-prob is of the temperature-1 policy, log_softmax(logits)[token], whatever the sampling "
                    "temperature: it is what the trainer's ratios compare with its own log-probs.",
    "logprob": "the log-prob is log_softmax(logits)[token] in float64, at temperature 1, of the token you return.",
    "temperature ignored": "your tokens follow softmax(z), not softmax(z / T): divide the logits by the temperature "
                           "before the softmax whose CDF you invert.",
    "off by one": "one token off: the token is the first index whose inclusive cumulative probability exceeds u, "
                  "torch.searchsorted(cdf, u, right=True) with cdf = softmax(z / T).cumsum(0) (an exclusive CDF "
                  "that starts at 0, or a + 1 or - 1, shifts every token), clamped to vocab - 1.",
    "distribution": "your tokens do not follow softmax(z / T): invert its CDF at one uniform u in [0, 1).",
    "consumption": "your tokens follow softmax(z / T) (the chi-square test passes), but not token for token with the "
                   "engine: your draw uses its generator differently (torch.multinomial, a float32 torch.rand, or "
                   "more than one number), so the same seed gives other tokens and an output would no longer equal "
                   "one request alone. Draw exactly one torch.rand((), generator=generator, dtype=torch.float64).",
    "token": "the same uniform, another token: invert the CDF of softmax(logits / T) computed in float64.",
    "loss type": "return a scalar tensor that autograd can differentiate (the mean over the masked tokens).",
    "mask": "the mean must run over the real tokens only (per_token[mask].mean()), not over every position.",
    "no kl": "add beta times Schulman's k3 estimate, kl_estimate(logp_new, logp_ref, 'k3'), to every token.",
    "sign": "the loss is minus the clipped surrogate (we minimise it), plus beta k3.",
    "on-policy": "with logp_behaviour = logp_old the weight is 1 and the loss is part 4's grpo_loss: the token mean "
                 "over the mask of -min(r A, clip(r, 1 - eps, 1 + eps) A) + beta k3, r = exp(logp_new - logp_old).",
    "truncate": "the weight is not truncated: w = min(exp(logp_old - logp_behaviour), cap), .clamp(max=cap).",
    "behaviour ratio": "the ratio is r = pi_theta / pi_old, exp(logp_new - logp_old); the behaviour policy mu enters "
                       "only through the weight w = min(pi_old / mu, cap), outside the clip.",
    "inverted": "the weight is pi_old / mu = exp(logp_old - logp_behaviour), not mu / pi_old.",
    "kl weighted": "the weight multiplies the clipped surrogate only; beta k3 is added to every token unweighted.",
    "cap": "use the cap (and clip, beta) passed in, not a fixed value.",
    "off-policy": "w = min(exp(logp_old - logp_behaviour), cap) held constant multiplies each token's clipped "
                  "surrogate: mean over the mask of -w min(r A, clip(r) A) + beta k3.",
    "gradient": "the value is right but its gradient is not: is a term computed from logp_new detached, or taken "
                "through .item()? Only the weight w is held constant.",
    "detach": "the weight w is a constant of the estimator: compute it with .detach() so that no gradient flows "
              "through logp_old or logp_behaviour by way of it.",
    "rollouts type": "return (outputs, hit_rate): a list of token lists, one per seed in group order, and a float.",
    "order": "the right samples in the wrong order: request i is problem i // group_size with seeds[i].",
    "greedy rollouts": "these are greedy outputs: sample with temperature=1.0 and seed=seeds[i].",
    "stop token": "your outputs run past the end mark: pass stop_token=END.",
    "sampling": "each request samples with its own generator: add_request(prompt, MAX_RESPONSE, temperature=1.0, "
                "seed=seeds[i], stop_token=END).",
    "unfinished": "run the engine until every request has finished (engine.run()).",
    "same step": "no prompt token came from the cache: requests admitted in the same step cannot hit each other's "
                 "blocks, because a block is registered in the cache once it is computed. Admit the first sample of "
                 "each group, run one engine.step() so its prompt is computed, then admit the G - 1 siblings.",
    "some groups": "fewer hits than (G - 1)/G x (L - 1)/L: admit the first sample of every group before the one "
                   "engine.step(), and every sibling after it.",
    "hit rate": "the hit rate is what the engine measured: the sum of engine.stats().requests[i].cached_tokens "
                "over your requests, divided by their prompt tokens.",
}
"""The hint of each way the checks fail (the student-edition test plants one)."""

DRAW_TEMPERATURES = (0.3, 0.7, 1.0, 1.6)
CHI_SQUARE_DRAWS, CHI_SQUARE_TEMPERATURE, SIGNIFICANCE = 3000, 0.5, 1e-3


def _fail(what: str, hint: str) -> CheckFailed:
    return CheckFailed(f"{what}\nHint: {HINTS[hint]}", HINTS[hint], None)


def _require_function(fn: object) -> None:
    if not callable(fn):
        raise ValueError(f"pass your function itself (a callable), got {type(fn).__name__}")


def _inverse_cdf(logits: torch.Tensor, temperature: float, u: torch.Tensor) -> torch.Tensor:
    """The tokens :func:`~utils.serving.runtime.sampling.draw` returns for uniforms ``u``: the first index whose
    cumulative ``softmax(logits / temperature)`` exceeds ``u``, clamped to the vocabulary."""
    cdf = torch.softmax(logits.double() / temperature, -1).cumsum(0)
    return torch.searchsorted(cdf, u, right=True).clamp(max=logits.numel() - 1)


def _pair(result: object, where: str) -> tuple[int, float]:
    """The reader's ``(token, log-prob)`` as Python numbers, or CheckFailed."""
    if not isinstance(result, tuple) or len(result) != 2:
        raise _fail(f"{where}: your draw returned {result!r:.80}.", "pair")
    token, logp = (x.item() if isinstance(x, torch.Tensor) and x.numel() == 1 else x for x in result)
    if isinstance(token, bool) or not isinstance(token, int) or not isinstance(logp, (int, float)):
        raise _fail(f"{where}: your draw returned ({token!r:.40}, {logp!r:.40}).", "pair")
    return token, float(logp)


def _uniforms(seed: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.rand((), generator=g, dtype=torch.float64) for _ in range(n)])


def _token_mistake(got: torch.Tensor, logits: torch.Tensor, temperature: float, u: torch.Tensor) -> str | None:
    """The hint key of a pattern in the tokens that differ from the engine's for the same uniforms, or None."""
    want = _inverse_cdf(logits, temperature, u)
    wrong = got != want
    if not bool(wrong.any()):
        return None
    if temperature != 1 and bool((got[wrong] == _inverse_cdf(logits, 1.0, u)[wrong]).all()):
        return "temperature ignored"
    if bool(((got[wrong] - want[wrong]).abs() == 1).all()):
        return "off by one"
    return None


def check_draw(fn: Callable[[torch.Tensor, float, torch.Generator | None], tuple[int, float]]
               ) -> dict[str, float]:
    """``fn(logits, temperature, generator)`` is the engine's :func:`~utils.serving.runtime.sampling.draw`:

    greedy at temperature 0; log-probs at temperature 1 (1e-12); 3,000 tokens at T = 0.5 pass a chi-square test
    against ``softmax(z / T)`` at significance 1e-3; and the same tokens, token for token with the same generator
    consumption, over 25 seeds x 4 temperatures x 4 consecutive draws on 14- and 40-token vocabularies.
    Returns the chi-square test's ``statistic``, ``dof`` and ``critical`` value."""
    _require_function(fn)
    rows = torch.Generator().manual_seed(0)
    for vocab in (14, 40):
        z = 2 * torch.randn(vocab, generator=rows, dtype=torch.float64)
        where = f"greedy draw on {vocab} logits"
        token, logp = _pair(fn(z, 0.0, torch.Generator().manual_seed(0)), where)
        if token != int(z.argmax()):
            raise _fail(f"{where}: token {token}, expected the argmax {int(z.argmax())}.", "greedy")
        if abs(logp - float(torch.log_softmax(z, -1)[token])) > 1e-12:
            raise _fail(f"{where}: log-prob {logp:.12g}, expected {float(torch.log_softmax(z, -1)[token]):.12g}.",
                        "logprob")
    cases = []  # (z, temperature, seed, your tokens, engine's tokens, generator states equal)
    for vocab in (14, 40):
        z = 2 * torch.randn(vocab, generator=rows, dtype=torch.float64)
        for temperature in DRAW_TEMPERATURES:
            for seed in range(25):
                mine, ref = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
                got, want, same_state = [], [], True
                for k in range(4):
                    where = f"draw {k} with seed {seed} at T = {temperature} on {vocab} logits"
                    token, logp = _pair(fn(z, temperature, mine), where)
                    if not 0 <= token < vocab:
                        raise _fail(f"{where}: token {token} is not in [0, {vocab}).", "off by one")
                    logp_t1 = float(torch.log_softmax(z, -1)[token])
                    if abs(logp - logp_t1) > 1e-12:
                        at_t = float(torch.log_softmax(z / temperature, -1)[token])
                        key = "logprob at T" if abs(logp - at_t) < 1e-9 else "logprob"
                        raise _fail(f"{where}: log-prob {logp:.12g} for token {token}, expected {logp_t1:.12g}.", key)
                    got.append(token)
                    want.append(draw(z, temperature, ref)[0])
                    same_state = same_state and torch.equal(mine.get_state(), ref.get_state())
                cases.append((z, temperature, seed, got, want, same_state))
    z = 1.5 * torch.randn(14, generator=rows, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    tokens = torch.tensor([_pair(fn(z, CHI_SQUARE_TEMPERATURE, g), "chi-square draw")[0]
                           for _ in range(CHI_SQUARE_DRAWS)])
    if not bool(((tokens >= 0) & (tokens < z.numel())).all()):
        raise _fail(f"chi-square draws: a token outside [0, {z.numel()}).", "off by one")
    statistic, dof = chi_square_statistic(torch.bincount(tokens, minlength=14),
                                          torch.softmax(z / CHI_SQUARE_TEMPERATURE, -1))
    critical = chi_square_critical(dof, SIGNIFICANCE)
    if statistic > critical:
        key = _token_mistake(tokens, z, CHI_SQUARE_TEMPERATURE, _uniforms(1, CHI_SQUARE_DRAWS)) or "distribution"
        raise _fail(f"{CHI_SQUARE_DRAWS:,} draws at T = {CHI_SQUARE_TEMPERATURE}: chi-square {statistic:.1f} above "
                    f"the critical {critical:.1f} ({dof} degrees of freedom, significance {SIGNIFICANCE:g}).", key)
    for z, temperature, seed, got, want, same_state in cases:
        if got != want:
            where = f"seed {seed} at T = {temperature} on {z.numel()} logits"
            if not same_state:
                key = "consumption"
            else:
                key = _token_mistake(torch.tensor(got), z, temperature, _uniforms(seed, 4)) or "token"
            raise _fail(f"{where}: your tokens {got}, the engine's {want}.", key)
    return {"statistic": statistic, "dof": dof, "critical": critical}


def _tis_variant(new, old, ref, behaviour, adv, mask, clip, beta, cap, *, weight="truncated", base="old",
                 kl_weighted=False) -> torch.Tensor:
    """A mistaken version of the TIS loss, to name a mistake: ``weight`` "truncated", "raw", "inverted" or "one";
    ``base`` the log-probs the ratio is taken against ("old" or "behaviour")."""
    w = {"truncated": torch.exp(old - behaviour).clamp(max=cap), "raw": torch.exp(old - behaviour),
         "inverted": torch.exp(behaviour - old).clamp(max=cap), "one": torch.ones_like(old)}[weight].detach()
    ratio = torch.exp(new - (old if base == "old" else behaviour))
    a = adv[:, None].expand_as(ratio)
    surrogate = -torch.minimum(ratio * a, ratio.clamp(1 - clip, 1 + clip) * a)
    kl = beta * kl_estimate(new, ref, "k3")
    per_token = w * (surrogate + kl) if kl_weighted else w * surrogate + kl
    return per_token[mask].mean()


def _loss_batch(seed: int, n: int = 16, t: int = 3) -> tuple[torch.Tensor, ...]:
    """Random fp64 (logp_new, logp_old, logp_ref, logp_behaviour, advantages, mask): ratios pi_old / mu from about
    0.2 to 5, so that some exceed the cap of 2."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=g, dtype=torch.float64)
    new = old + 0.3 * torch.randn(n, t, generator=g, dtype=torch.float64)
    ref = old + 0.1 * torch.randn(n, t, generator=g, dtype=torch.float64)
    behaviour = old - 0.7 * torch.randn(n, t, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    mask = torch.rand(n, t, generator=g) < 0.7
    mask[:, 0] = True
    return new, old, ref, behaviour, adv, mask


def _scalar(loss: object, where: str) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise _fail(f"{where}: your loss is {loss!r:.80}.", "loss type")
    return loss.reshape(())


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-12) -> bool:
    return bool(torch.allclose(a.detach(), b.detach(), rtol=tol, atol=tol))


def check_tis_loss(fn: Callable[..., torch.Tensor]) -> None:
    """``fn(logp_new, logp_old, logp_ref, logp_behaviour, advantages, mask, clip, beta, cap)`` equals
    :func:`~utils.capstone.grpo_engine.tis_grpo_loss`: part 4's ``grpo_loss`` on-policy, the reference's value and
    gradient in ``logp_new`` off-policy (1e-12, fp64, three settings of clip, beta, cap), with the weight held
    constant (no gradient reaches ``logp_behaviour``, and ``logp_old`` only through the ratio)."""
    _require_function(fn)
    new, old, ref, behaviour, adv, mask = _loss_batch(0)
    new = new.requires_grad_()
    got = _scalar(fn(new, old, ref, old, adv, mask, 0.2, 0.04, 2.0), "on-policy (logp_behaviour = logp_old)")
    want = grpo_loss(new, old, ref, adv, mask, 0.2, 0.04)
    if not _close(got, want):
        everywhere = _tis_variant(new, old, ref, old, adv, torch.ones_like(mask), 0.2, 0.04, 2.0)
        no_kl = grpo_loss(new, old, ref, adv, mask, 0.2, 0.0)
        key = "mask" if _close(got, everywhere) else "no kl" if _close(got, no_kl) \
            else "sign" if _close(-got, want) else "on-policy"
        raise _fail(f"on-policy (logp_behaviour = logp_old): your loss {float(got.detach()):.12g}, part 4's "
                    f"grpo_loss {float(want.detach()):.12g}.", key)
    for seed, (clip, beta, cap) in enumerate([(0.2, 0.04, 2.0), (0.1, 0.1, 1.5), (0.3, 0.0, 3.0)], start=1):
        new, old, ref, behaviour, adv, mask = _loss_batch(seed)
        new, old, behaviour = new.requires_grad_(), old.requires_grad_(), behaviour.requires_grad_()
        where = f"off-policy, clip {clip}, beta {beta}, cap {cap}"
        got = _scalar(fn(new, old, ref, behaviour, adv, mask, clip, beta, cap), where)
        want = tis_grpo_loss(new, old, ref, behaviour, adv, mask, clip, beta, cap)
        if not _close(got, want):
            variants = {"truncate": dict(weight="raw"), "behaviour ratio": dict(weight="one", base="behaviour"),
                        "inverted": dict(weight="inverted"), "kl weighted": dict(kl_weighted=True)}
            key = next((k for k, v in variants.items()
                        if _close(got, _tis_variant(new, old, ref, behaviour, adv, mask, clip, beta, cap, **v))), None)
            if key is None and _close(got, _tis_variant(new, old, ref, behaviour, adv, mask, clip, beta, cap,
                                                        weight="truncated", base="behaviour")):
                key = "behaviour ratio"
            if key is None and _close(got, tis_grpo_loss(new, old, ref, behaviour, adv, mask, clip, beta, 2.0)):
                key = "cap"
            raise _fail(f"{where}: your loss {float(got.detach()):.12g}, expected {float(want.detach()):.12g}.",
                        key or "off-policy")
        grads = torch.autograd.grad(got, (new, old, behaviour), allow_unused=True)
        ref_grads = torch.autograd.grad(want, (new, old, behaviour), allow_unused=True)
        mine = [torch.zeros_like(x) if gr is None else gr for gr, x in zip(grads, (new, old, behaviour))]
        theirs = [torch.zeros_like(x) if gr is None else gr for gr, x in zip(ref_grads, (new, old, behaviour))]
        if not _close(mine[0], theirs[0], 1e-10):
            raise _fail(f"{where}: the gradient in logp_new differs from the reference's by up to "
                        f"{float((mine[0] - theirs[0]).abs().max()):.3g}.", "gradient")
        if not (_close(mine[2], theirs[2], 1e-10) and _close(mine[1], theirs[1], 1e-10)):
            raise _fail(f"{where}: a gradient reaches logp_behaviour (largest {float(mine[2].abs().max()):.3g}) or "
                        f"logp_old differs from the reference's.", "detach")


def _random_llama() -> TinyLlama:
    torch.manual_seed(3)
    return TinyLlama(CONFIG).double().eval()


def check_group_rollouts(fn: Callable[..., tuple[list[list[int]], float]], model: TinyLlama | None = None) -> list:
    """``fn(engine, problems, group_size, seeds)`` samples each problem's group on a fresh engine
    (:func:`~utils.capstone.engine_rollouts.new_engine`) and returns ``(outputs, hit_rate)``: every output equals
    one request alone with its seed (:func:`~utils.serving.runtime.sampling.sample_reference`, temperature 1, stop
    at ``END``), and the hit rate is the engine's measured one and equals
    :func:`~utils.capstone.engine_rollouts.expected_hit_rate` exactly, for groups of 8 and 4.
    ``model`` defaults to a random ``TinyLlama(CONFIG)`` in fp64. Returns ``(G, hit rate)`` of each case."""
    _require_function(fn)
    model = _random_llama() if model is None else model
    if not isinstance(model, TinyLlama):
        raise ValueError(f"model must be a utils.attention.llama.TinyLlama, got {type(model).__name__}")
    seen = []
    for problems, group in ((all_prompts()[10:14], 8), (all_prompts()[41:44], 4)):
        seeds = list(range(100 * group, 100 * group + len(problems) * group))
        engine = new_engine(model, len(seeds))
        result = fn(engine, problems, group, seeds)
        where = f"{len(problems)} problems x G = {group}"
        if not isinstance(result, tuple) or len(result) != 2 or not isinstance(result[0], (list, tuple)) \
                or len(result[0]) != len(seeds):
            raise _fail(f"{where}: your function returned {result!r:.80}.", "rollouts type")
        outputs, hit_rate = [[int(t) for t in out] for out in result[0]], result[1]
        if engine.has_unfinished():
            raise _fail(f"{where}: requests are still running after your function returned.", "unfinished")
        prompts = prompt_tokens(problems).tolist()
        want = [sample_reference(model, prompts[i // group], MAX_RESPONSE, 1.0, s, END)[0] for i, s in enumerate(seeds)]
        wrong = [i for i, (a, b) in enumerate(zip(outputs, want)) if a != b]
        if wrong:
            i = wrong[0]
            greedy = sample_reference(model, prompts[i // group], MAX_RESPONSE, 0.0, None, END)[0]
            key = "order" if sorted(outputs) == sorted(want) else "greedy rollouts" if outputs[i] == greedy \
                else "stop token" if outputs[i][:len(want[i])] == want[i] else "sampling"
            raise _fail(f"{where}: request {i} (problem {i // group}, seed {seeds[i]}) gave {outputs[i]}, one "
                        f"request alone {want[i]}.", key)
        stats = engine.stats()
        cached = sum(r.cached_tokens for r in stats.requests.values())
        measured = cached / sum(r.prompt_tokens for r in stats.requests.values())
        expected = expected_hit_rate(group, PROMPT_LEN)
        if abs(measured - expected) > 1e-12:
            key = "same step" if cached == 0 else "some groups"
            raise _fail(f"{where}: the engine found {cached} prompt tokens in its cache, a hit rate of "
                        f"{measured:.4f}; expected {expected:.4f}.", key)
        if not isinstance(hit_rate, (int, float)) or abs(float(hit_rate) - measured) > 1e-12:
            raise _fail(f"{where}: you returned a hit rate of {hit_rate!r:.40}, the engine measured {measured:.4f}.",
                        "hit rate")
        seen.append((group, measured))
    return seen
