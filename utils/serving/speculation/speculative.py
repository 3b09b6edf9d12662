"""Speculative decoding: a small draft proposes ``k`` tokens, the target verifies them in one pass.

Leviathan, Kalman & Matias 2023 ("Fast Inference from Transformers via
Speculative Decoding", arXiv:2211.17192, Algorithm 1) and Chen et al. 2023
("Accelerating Large Language Model Decoding with Speculative Sampling",
arXiv:2302.01318, Algorithm 2) found the same rule independently. With draft
probabilities ``q`` and target probabilities ``p`` at a drafted position, the
draft token ``x`` is kept with probability ``min(1, p(x) / q(x))``; on the first
rejection a token is drawn from the residual ``norm(max(0, p - q))`` and the
step ends; if all ``k`` are kept, a bonus token is drawn from the target's
``(k+1)``-th distribution. Every emitted token is then distributed exactly as
``p`` (Leviathan et al., appendix; proved in the chapter):

``P(y) = q(y) min(1, p(y)/q(y)) + (1 - sum_x min(p(x), q(x))) * max(0, p(y) - q(y)) / Z = p(y)``,

with ``Z = sum_y max(0, p(y) - q(y)) = 1 - sum_x min(p(x), q(x))``.

Greedy decoding is the special case of one-hot ``p`` and ``q`` (temperature 0):
a draft token is kept iff it is the target's argmax, and the correction is the
target's argmax, so the output is exactly the target's greedy output.

If each draft token is accepted independently with probability ``alpha``
(Leviathan et al.'s simplifying assumption, section 3.4), a step emits
``(1 - alpha^(k+1)) / (1 - alpha)`` tokens on average (their section 3), and
with a draft that costs ``c`` target forward passes per token, the expected
walltime improvement is ``(1 - alpha^(k+1)) / ((1 - alpha)(k c + 1))``
(their Theorem 3.8).

That theorem takes the verify pass to cost one target pass. :func:`roofline_speedup`
prices it instead with part 5's one step model (:mod:`utils.serving.costs.step_time`,
chapter 1): the weight matmuls and attention over the caches are separate kernels,
each on its own roofline, and the step takes the sum of the two times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from utils.attention.llama import TinyLlama
from utils.gpu.roofline import OpCost
from utils.serving.costs.step_time import Roof, ServedModel, StepCost, step_cost, step_seconds
from utils.validate import check_nonnegative, check_nonnegative_int, check_positive_int

__all__ = ["SpeculativeResult", "accept_draft", "expected_acceptance", "expected_speedup",
           "expected_tokens_per_step", "optimal_k", "probabilities", "roofline_speedup", "simulate_tokens_per_step",
           "speculative_generate", "verify_step_cost"]

_SUM_TOLERANCE = 1e-3


def _check_distributions(name: str, probs: torch.Tensor) -> None:
    if not torch.is_tensor(probs) or probs.dim() != 2 or not probs.is_floating_point():
        raise ValueError(f"{name} must be a 2-D float tensor (positions, vocab), got "
                         f"{getattr(probs, 'shape', type(probs).__name__)}")
    if probs.numel():  # one reduction for both bounds (verification calls this twice per step)
        low, high = (float(v) for v in torch.aminmax(probs))
        if not (low >= 0 and high < math.inf):  # a NaN fails both comparisons
            raise ValueError(f"{name} must hold finite, non-negative probabilities")
    if probs.shape[0]:
        sums = probs.double().sum(-1)
        if not float((sums - 1).abs().max()) <= _SUM_TOLERANCE:
            raise ValueError(f"every row of {name} must sum to 1 (within {_SUM_TOLERANCE}), got sums {sums.tolist()}")


def accept_draft(p: torch.Tensor, q: torch.Tensor, draft_tokens, generator: torch.Generator | None = None
                 ) -> list[int]:
    """One verification step: the accepted draft tokens, then one corrected or bonus token.

    ``p`` is ``(k+1, vocab)``: the target's next-token probabilities after the
    context and after each of the ``k`` draft tokens; ``q`` is ``(k, vocab)``, the
    draft's, from which ``draft_tokens`` (``k`` ints) were sampled. For ``i = 0..k-1``
    draw ``r ~ U(0, 1)``; keep ``x_i`` if ``r < p_i(x_i) / q_i(x_i)``, else return the
    kept tokens plus a sample of ``norm(max(0, p_i - q_i))``. With all ``k`` kept,
    append a sample of ``p_k``. So it returns between 1 and ``k + 1`` tokens
    (Leviathan et al. 2023, Algorithm 1). ``k = 0`` is allowed: one sample of ``p_0``.
    Raises ``ValueError`` on mismatched shapes, rows that are not distributions,
    or a draft token outside the vocabulary or with ``q_i(x_i) = 0``.
    """
    _check_distributions("p", p)
    _check_distributions("q", q)
    k, vocab = q.shape
    if p.shape != (k + 1, vocab):
        raise ValueError(f"p must be (k+1, vocab) = ({k + 1}, {vocab}) for q of shape {tuple(q.shape)}, "
                         f"got {tuple(p.shape)}")
    tokens = [int(t) for t in (draft_tokens.tolist() if torch.is_tensor(draft_tokens) else draft_tokens)]
    if len(tokens) != k:
        raise ValueError(f"draft_tokens must hold k = {k} tokens (one per row of q), got {len(tokens)}")
    for i, x in enumerate(tokens):
        if not 0 <= x < vocab:
            raise ValueError(f"draft token {i} is {x}, outside the vocabulary [0, {vocab})")
        if float(q[i, x]) <= 0:
            raise ValueError(f"draft token {i} ({x}) has draft probability 0: it cannot have been sampled from q")
    p64, q64 = p.double(), q.double()
    out: list[int] = []
    for i, x in enumerate(tokens):
        r = float(torch.rand((), generator=generator, dtype=torch.float64))
        if r * float(q64[i, x]) < float(p64[i, x]):  # r < p/q, without dividing
            out.append(x)
            continue
        residual = (p64[i] - q64[i]).clamp_min(0)
        if float(residual.sum()) <= 0:  # p == q up to rounding: then the residual is p itself
            residual = p64[i]
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(p64[k] / p64[k].sum(), 1, generator=generator)))
    return out


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``softmax(logits / T)`` on the last dimension, or the one-hot argmax for ``T = 0`` (greedy), in fp64."""
    check_nonnegative("temperature", temperature, finite=True)
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).double()
    return (logits.double() / temperature).softmax(-1)


@dataclass
class SpeculativeResult:
    """What :func:`speculative_generate` returns.

    ``tokens``: ``(1, prompt + n_new)``, the prompt then the new tokens, as ``TinyLlama.generate`` returns them.
    ``drafted[s]`` / ``accepted[s]``: draft tokens proposed / kept in verification step ``s``; each step
    also emits one target token, so step ``s`` emits ``accepted[s] + 1`` tokens.
    """

    tokens: torch.Tensor
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    proposals: list[list[int]] = field(default_factory=list)
    """``proposals[s]``: the draft tokens of step ``s`` (kept or not), for pages that draw the steps."""

    @property
    def target_calls(self) -> int:
        """Target forward passes (the first also prefills the prompt)."""
        return len(self.accepted)

    @property
    def acceptance_rate(self) -> float:
        """Kept draft tokens over proposed ones (``nan`` if none was proposed)."""
        total = sum(self.drafted)
        return sum(self.accepted) / total if total else float("nan")

    @property
    def tokens_per_step(self) -> float:
        """New tokens per target forward pass."""
        return (sum(self.accepted) + len(self.accepted)) / max(1, len(self.accepted))


def _truncate(caches: list[dict], length: int) -> None:
    """Roll a TinyLlama KV cache (one dict per layer, ``k``/``v`` of shape ``(b, h, s, d)``) back to ``length``."""
    for cache in caches:
        if cache and cache["k"].shape[2] > length:
            cache["k"], cache["v"] = cache["k"][:, :, :length], cache["v"][:, :, :length]


def _cached(caches: list[dict]) -> int:
    return caches[0]["k"].shape[2] if caches and caches[0] else 0


@torch.no_grad()
def speculative_generate(target: TinyLlama, draft: TinyLlama, prompt: torch.Tensor, n_new: int, k: int,
                         temperature: float = 0.0, generator: torch.Generator | None = None) -> SpeculativeResult:
    """Generate ``n_new`` tokens of ``target`` after ``prompt`` (``(1, seq)`` or ``(seq,)``) with ``draft``'s help.

    Each step: the draft proposes ``k`` tokens one at a time on its own KV cache;
    the target scores the uncached committed tokens and all ``k`` proposals in
    **one** forward pass, giving ``k + 1`` distributions; :func:`accept_draft`
    keeps a prefix and adds one target token; both caches are rolled back to the
    committed tokens. The last step drafts fewer tokens so that exactly ``n_new``
    come out. ``temperature = 0`` is greedy and returns exactly
    ``target.generate(prompt, n_new)`` (up to argmax ties at float rounding);
    ``T > 0`` samples ``softmax(logits / T)`` of the target exactly. Both models
    must share the vocabulary.
    """
    check_positive_int("n_new", n_new)
    check_nonnegative_int("k", k)
    check_nonnegative("temperature", temperature, finite=True)
    if not isinstance(target, TinyLlama) or not isinstance(draft, TinyLlama):
        raise ValueError("target and draft must be utils.attention.llama.TinyLlama models")
    if target.config.vocab != draft.config.vocab:
        raise ValueError(f"target and draft must share the vocabulary, got {target.config.vocab} and "
                         f"{draft.config.vocab}")
    if prompt.dim() == 1:
        prompt = prompt[None]
    if prompt.dim() != 2 or prompt.shape[0] != 1 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must be (1, seq >= 1) or (seq,) tokens (one sequence), got {tuple(prompt.shape)}")
    seq = prompt[0].tolist()
    goal = len(seq) + n_new
    target_caches: list[dict] = [{} for _ in target.blocks]
    draft_caches: list[dict] = [{} for _ in draft.blocks]
    result = SpeculativeResult(tokens=prompt)
    while len(seq) < goal:
        k_step = min(k, goal - len(seq) - 1)
        proposal: list[int] = []
        q_rows = []
        for _ in range(k_step):  # draft: k_step cached decode steps
            step_input = torch.tensor([(seq + proposal)[_cached(draft_caches):]])
            q_row = probabilities(draft(step_input, draft_caches)[0, -1], temperature)
            proposal.append(int(torch.multinomial(q_row, 1, generator=generator)))
            q_rows.append(q_row)
        start = _cached(target_caches)  # verify: one target pass over the uncached tokens and the proposal
        logits = target(torch.tensor([seq[start:] + proposal]), target_caches)[0]
        p = probabilities(logits[len(seq) - start - 1:], temperature)
        q = torch.stack(q_rows) if q_rows else p.new_zeros(0, p.shape[-1])
        emitted = accept_draft(p, q, proposal, generator)
        seq.extend(emitted)
        result.drafted.append(k_step)
        result.proposals.append(proposal)
        result.accepted.append(len(emitted) - 1)
        _truncate(target_caches, len(seq) - 1)  # the last emitted token is not yet in any cache
        _truncate(draft_caches, len(seq) - 1)
    result.tokens = torch.tensor([seq], dtype=prompt.dtype)
    return result


def _check_alpha(alpha: float) -> float:
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha (the acceptance rate) must be a number in [0, 1], got {alpha!r}")
    return float(alpha)


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """``(1 - alpha^(k+1)) / (1 - alpha)``: tokens per target pass with i.i.d. acceptance ``alpha``; ``k+1`` at 1.

    Leviathan et al. 2023, section 3: the step emits ``1 + min(k, number of
    kept tokens before the first rejection)``, a capped geometric variable.
    """
    alpha = _check_alpha(alpha)
    check_nonnegative_int("k", k)
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Expected walltime improvement ``(1 - alpha^(k+1)) / ((1 - alpha)(k c + 1))`` (Leviathan et al., Theorem 3.8).

    ``c`` is the draft's time per token over the target's time per forward pass;
    it assumes that verifying ``k + 1`` tokens costs one target pass (memory-bound decode).
    """
    check_nonnegative("c (draft cost ratio)", c, finite=True)
    return expected_tokens_per_step(alpha, k) / (k * c + 1)


def optimal_k(alpha: float, c: float, k_max: int = 32) -> int:
    """The ``k`` in ``0..k_max`` with the largest :func:`expected_speedup` (``0`` means: don't speculate)."""
    check_nonnegative_int("k_max", k_max)
    return max(range(k_max + 1), key=lambda k: expected_speedup(alpha, k, c))


def expected_acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``beta = sum_x min(p(x), q(x)) = 1 - TV(p, q)``, the acceptance probability per row (Leviathan et al., 3.3)."""
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    return torch.minimum(p, q).sum(-1)


def simulate_tokens_per_step(alpha: float, k: int, n_steps: int, generator: torch.Generator | None = None
                             ) -> float:
    """Mean tokens per step over ``n_steps`` simulated steps, each draft token kept with probability ``alpha``."""
    alpha = _check_alpha(alpha)
    check_nonnegative_int("k", k)
    check_positive_int("n_steps", n_steps)
    kept = torch.rand(n_steps, k, generator=generator, dtype=torch.float64) < alpha
    accepted = kept.int().cumprod(-1).sum(-1)  # kept tokens before the first rejection
    return float((accepted + 1).double().mean())


def verify_step_cost(model: ServedModel, batch: int, context: int, k: int) -> StepCost:
    """FLOPs and HBM bytes of one verification pass: ``k + 1`` tokens for each of ``batch`` sequences.

    Chapter 1's decode step (:func:`utils.serving.costs.step_time.step_cost` with ``batch``
    sequences attending to ``context`` tokens) with ``k + 1`` times the FLOPs in each part
    and the same bytes, since the ``k + 1`` tokens of a sequence share its weights' and its
    cache's reads. Weight matmuls: ``2 N B (k + 1)`` FLOPs over ``N b`` bytes; attention:
    ``f B (k + 1) S`` FLOPs over ``B S kv_bytes_per_token`` bytes (``f`` FLOPs per query and
    attended token, :mod:`utils.serving.costs.step_time`). The ``k`` extra cache rows the drafted
    tokens add are left out, so ``k = 0`` is exactly a decode step.
    """
    check_positive_int("batch", batch)
    check_nonnegative_int("context", context)
    check_nonnegative_int("k", k)
    decode = step_cost(model, [context] * batch)
    return StepCost(OpCost(decode.linear.flops * (k + 1), decode.linear.nbytes),
                    OpCost(decode.attention.flops * (k + 1), decode.attention.nbytes), decode.tokens * (k + 1))


def roofline_speedup(alpha: float, k: int, c: float, model: ServedModel, batch: int, context: int, roof: Roof,
                     overlap: bool = False) -> float:
    """Leviathan's speed-up with the verify pass priced on the roofline instead of assumed free.

    ``E[tokens] t_decode / (t_verify + k c t_decode)``, with ``t_decode`` and ``t_verify``
    the step times of a decode step of ``batch`` sequences and of :func:`verify_step_cost`,
    both by :func:`utils.serving.costs.step_time.step_seconds`:
    ``max(F_w/P, B_w/W) + max(F_a/P, B_a/W)``, weight matmuls and attention as separate
    kernels (chapter 1's step model). While both kernels stay memory-bound,
    ``t_verify = t_decode`` and this is :func:`expected_speedup`; once ``batch (k + 1)``
    tokens take them past the ridge, ``t_verify`` grows with ``k + 1`` and the gain
    shrinks, whatever the caches add to the attention kernel's bytes.

    ``overlap=True`` prices both passes with the single ``max(F/P, B/W)`` over the whole
    step instead (perfect overlap, which chapter 1 rejects); it is there only to compare
    the two models.
    """
    check_nonnegative("c (draft cost ratio)", c, finite=True)
    if not isinstance(roof, Roof):
        raise ValueError(f"roof must be a utils.serving.costs.step_time.Roof (Roof.of(gpu, precision)), got {roof!r}")
    t_decode = step_seconds(verify_step_cost(model, batch, context, 0), roof, overlap)
    t_verify = step_seconds(verify_step_cost(model, batch, context, k), roof, overlap)
    return expected_tokens_per_step(alpha, k) * t_decode / (t_verify + k * c * t_decode)
