"""Capstone 2's rollouts: part 4's arithmetic task served by part 5's engine, the G samples of a prompt sharing it.

The policy is part 3's :class:`~utils.attention.llama.TinyLlama` on part 4's character vocabulary
(:mod:`utils.rl.tiny_lm`: prompts ``"a+b="``, responses like ``"15."``), pre-trained on part 4's noisy
corpus (:func:`pretrained_llama`), so that the engine, which serves a ``TinyLlama``, can sample it.

:func:`engine_rollouts` samples ``group_size`` responses to each prompt, as GRPO needs, with
continuous batching and prefix caching. The first sample of each group is admitted alone and its
prompt prefilled; the ``G - 1`` siblings are admitted after that step, so that their prompt blocks
are found in the cache (requests admitted in the same step cannot hit each other's blocks: a block
is registered once computed). Every sibling still computes its last prompt token, whose logits it
samples its first token from: with blocks of one token, ``(G - 1)/G`` of the prompt tokens past the
first ``(L - 1)`` of each prompt are hits, ``(G - 1)(L - 1)/(G L)`` of all prompt tokens
(:func:`expected_hit_rate`). vLLM's prefix cache keeps the same rule: a prompt found whole in the
cache still recomputes its last token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.rl.tiny_lm import END, MAX_RESPONSE, PAD, PROMPT_LEN, VOCAB, arithmetic_corpus, prompt_tokens, train_lm
from utils.serving.runtime.engine import Engine
from utils.train_once import train_once
from utils.validate import check_positive_int

CONFIG = LlamaConfig(vocab=len(VOCAB), dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128)
"""Part 3's LLaMA sized like part 4's TinyLM (d 64, 2 layers, 4 heads), with GQA (2 key/value heads)."""
BLOCK_SIZE = 1
"""One token per KV block, so that every prompt token but the last can be a prefix-cache hit."""


@train_once
def pretrained_llama(n_sequences: int = 20_000, noise: float = 0.5, steps: int = 600, lr: float = 3e-3,
                     batch_size: int = 128, seed: int = 0) -> tuple[TinyLlama, list[float]]:
    """``(model, losses)``: a ``TinyLlama(CONFIG)`` in fp64 pre-trained as part 4 pre-trains its TinyLM
    (:func:`utils.rl.starting_point.pretrained_lm`'s recipe: ``train_lm`` on ``arithmetic_corpus(n, noise)``).
    fp64 so that the engine's log-probs and the trainer's agree to rounding, and any gap is the algorithm's."""
    torch.manual_seed(seed)
    model = TinyLlama(CONFIG).double()
    losses = train_lm(model, arithmetic_corpus(n_sequences, noise=noise, seed=seed), steps=steps, lr=lr,
                      batch_size=batch_size, seed=seed, desc="pre-train")
    return model.eval(), losses


def to_sequence(prompt: list[int], output: list[int]) -> list[int]:
    """Prompt and response as part 4's ``(SEQ_LEN,)`` row: cut at a sampled padding token, padded after."""
    response = list(output[:MAX_RESPONSE])
    if PAD in response:
        response = response[:response.index(PAD) + 1]
    return list(prompt) + response + [PAD] * (MAX_RESPONSE - len(response))


def new_engine(model: TinyLlama, max_requests: int, prefix_caching: bool = True,
               decode_attention: str = "batched") -> Engine:
    """An engine with room for ``max_requests`` arithmetic requests at once, one step's budget for all of them."""
    check_positive_int("max_requests", max_requests)
    blocks = max_requests * (PROMPT_LEN + MAX_RESPONSE)
    return Engine(model, num_blocks=blocks, block_size=BLOCK_SIZE, max_num_batched_tokens=blocks,
                  prefix_caching=prefix_caching, decode_attention=decode_attention)


@dataclass
class Rollouts:
    """``group_size`` sampled responses to each prompt, in group order."""

    sequences: torch.Tensor
    """``(n_prompts * G, SEQ_LEN)`` token ids, part 4's layout."""
    logprobs: torch.Tensor
    """``(n_prompts * G, MAX_RESPONSE)`` the engine's temperature-1 log-probs of the response tokens (0 past the end)."""
    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens whose keys and values came from the prefix cache."""
    engine_steps: int
    seconds: float

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens


def expected_hit_rate(group_size: int, prompt_len: int = PROMPT_LEN, block_size: int = BLOCK_SIZE) -> float:
    """``(G - 1)/G * floor((L - 1)/B) B / L``: siblings hit every full block but the one holding the last token."""
    return (group_size - 1) / group_size * ((prompt_len - 1) // block_size) * block_size / prompt_len


def engine_rollouts(engine: Engine, problems: list[tuple[int, int]], group_size: int, seeds: list[int],
                    temperature: float = 1.0) -> Rollouts:
    """Sample ``group_size`` responses to each problem on ``engine`` (idle), request ``i`` with ``seeds[i]``."""
    check_positive_int("group_size", group_size)
    if len(seeds) != len(problems) * group_size:
        raise ValueError(f"need one seed per sample: {len(problems) * group_size}, got {len(seeds)}")
    if engine.has_unfinished():
        raise ValueError("the engine is still serving requests; rollouts need it idle")
    start, steps0 = time.perf_counter(), engine.stats().steps
    prompts = prompt_tokens(problems).tolist()
    ids: list[int | None] = [None] * len(seeds)

    def add(i: int) -> None:
        ids[i] = engine.add_request(prompts[i // group_size], MAX_RESPONSE, temperature=temperature,
                                    seed=seeds[i], stop_token=END)

    for p in range(len(problems)):
        add(p * group_size)
    engine.step()  # every group's first sample prefills its prompt, whose blocks are then in the cache
    for i in range(len(seeds)):
        if ids[i] is None:
            add(i)
    out = engine.run()
    stats = engine.stats()
    sequences, logprobs = [], []
    for i, rid in enumerate(ids):
        row = to_sequence(prompts[i // group_size], out[rid])
        sequences.append(row)
        lp = engine.output_logprobs(rid)[:MAX_RESPONSE]
        logprobs.append(lp + [0.0] * (MAX_RESPONSE - len(lp)))
    cached = sum(stats.requests[rid].cached_tokens for rid in ids)
    return Rollouts(torch.tensor(sequences), torch.tensor(logprobs, dtype=torch.float64),
                    PROMPT_LEN * len(seeds), cached, stats.steps - steps0, time.perf_counter() - start)
