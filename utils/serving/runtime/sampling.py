"""Sampling one token from a step's logits: greedy, or with a temperature from a per-request seeded generator.

An engine that batches requests must sample each one as if it ran alone, or its outputs would depend
on who else was in the batch. vLLM gives each request its own ``torch.Generator`` when its
``SamplingParams`` carry a ``seed`` (``vllm/v1/sample``), and so does :class:`utils.serving.runtime.engine.Engine`.
:func:`draw` is the one draw both the engine and :func:`sample_reference` (one request, the whole
sequence recomputed at every token, no cache) make, so that in float64 the two agree token for token
with the same seed: one uniform ``u`` from the request's generator per token, and the token is the first
whose cumulative probability under ``softmax(logits / T)`` exceeds ``u`` (inverse-CDF sampling).

The log-probability returned is that of the temperature-1 policy, ``log softmax(logits)[token]``: what
RL's importance ratios compare with the trainer's (vLLM's ``logprobs`` are also of the unscaled
distribution unless asked otherwise).
"""

from __future__ import annotations

import math

import torch

from utils.attention.llama import TinyLlama
from utils.validate import check_positive_int

__all__ = ["check_sampling", "draw", "make_generator", "sample_reference"]


def check_sampling(temperature: float, seed: int | None, stop_token: int | None, vocab: int) -> None:
    """``ValueError`` unless ``temperature`` is finite and >= 0, ``seed`` None or an int >= 0 and ``stop_token``
    None or a token id below ``vocab``."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not math.isfinite(temperature) \
            or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 is greedy), got {temperature!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed must be None or an int >= 0, got {seed!r}")
    if stop_token is not None and (isinstance(stop_token, bool) or not isinstance(stop_token, int)
                                   or not 0 <= stop_token < vocab):
        raise ValueError(f"stop_token must be None or a token id in [0, {vocab}), got {stop_token!r}")


def make_generator(seed: int | None) -> torch.Generator | None:
    """A CPU generator seeded with ``seed``, or None (torch's global generator) without one."""
    return None if seed is None else torch.Generator().manual_seed(seed)


def draw(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None) -> tuple[int, float]:
    """``(token, log p(token))`` from one row of logits: argmax at ``temperature = 0``, else inverse-CDF sampling
    of ``softmax(logits / temperature)`` with one uniform from ``generator``; the log-prob is at temperature 1."""
    if logits.dim() != 1:
        raise ValueError(f"logits must be one row (vocab,), got shape {tuple(logits.shape)}")
    row = logits.detach().to("cpu", torch.float64)
    logp = torch.log_softmax(row, -1)
    if temperature == 0:
        token = int(row.argmax())
    else:
        cdf = torch.softmax(row / temperature, -1).cumsum(0)
        u = torch.rand((), generator=generator, dtype=torch.float64)
        token = min(int(torch.searchsorted(cdf, u, right=True)), row.numel() - 1)
    return token, float(logp[token])


@torch.no_grad()
def sample_reference(model: TinyLlama, prompt: list[int], max_new_tokens: int, temperature: float = 0.0,
                     seed: int | None = None, stop_token: int | None = None) -> tuple[list[int], list[float]]:
    """One request alone, the reference an engine's sampled output must equal: each token drawn by :func:`draw`
    from the logits of the whole sequence so far (no KV cache), until ``max_new_tokens`` or ``stop_token``.
    Returns the new tokens and their temperature-1 log-probs."""
    check_positive_int("max_new_tokens", max_new_tokens)
    check_sampling(temperature, seed, stop_token, model.config.vocab)
    generator = make_generator(seed)
    device = next(model.parameters()).device
    tokens, out, logps = list(prompt), [], []
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([tokens], device=device))[0, -1]
        token, logp = draw(logits, temperature, generator)
        tokens.append(token)
        out.append(token)
        logps.append(logp)
        if token == stop_token:
            break
    return out, logps
