"""A synthetic token corpus with learnable structure, and a tiny LLaMA trained on it in seconds.

Part 5's engines need models whose predictions mean something: a speculative
draft must agree with its target often but not always, a quantised model must
lose measurable quality. A random-weight model gives neither. This corpus has
two kinds of structure, so that models of different sizes learn different
amounts of it:

- a **sparse Markov chain**: each token ``a`` has ``branching`` successors,
  drawn once from the seed, with probabilities proportional to
  ``decay^0, decay^1, ...``. One attention layer (or none) learns this
  bigram table;
- **copies**: with probability ``copy_prob`` per sequence position, a span of
  ``copy_len`` tokens that already occurred earlier in the sequence is
  repeated. Predicting the rest of a span needs an *induction head*, which
  takes two attention layers (Olsson et al. 2022, "In-context Learning and
  Induction Heads"): a deeper target learns it, a one-layer draft does not,
  so their greedy agreement sits strictly between 0 and 1.

Everything is a pure function of the seed. Training runs on the CPU in a few
seconds (the page's own thread count), once per machine and code version
(:mod:`utils.train_once`); its last digits depend on the CPU's vector width, so
pages print its results only at stable precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from utils.attention.llama import LlamaConfig, TinyLlama
from utils.train_once import train_once
from utils.validate import check_nonnegative_int, check_positive, check_positive_int

__all__ = ["DRAFT_CONFIGS", "TARGET_CONFIG", "CorpusSpec", "evaluate", "make_corpus", "transition_matrix",
           "train_tiny_llama"]

TARGET_CONFIG = LlamaConfig(vocab=64, dim=64, n_layers=4, n_heads=4, n_kv_heads=4, ffn_hidden=128)
"""Part 5's target model: 4 layers of width 64 (about 0.2 M parameters), about 10 s of training on one thread."""

DRAFT_CONFIGS = {
    "1 layer, dim 32": LlamaConfig(vocab=64, dim=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_hidden=64),
    "2 layers, dim 32": LlamaConfig(vocab=64, dim=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_hidden=64),
}
"""Drafts for :data:`TARGET_CONFIG`: the same vocabulary, a fraction of its layers and width."""


@dataclass(frozen=True)
class CorpusSpec:
    """The corpus's parameters: vocabulary, Markov branching and decay, copy probability and span length."""

    vocab: int = 64
    branching: int = 4
    decay: float = 0.5
    copy_prob: float = 0.08
    copy_len: int = 8

    def __post_init__(self) -> None:
        check_positive_int("vocab", self.vocab)
        check_positive_int("branching", self.branching)
        check_positive_int("copy_len", self.copy_len)
        if self.branching > self.vocab:
            raise ValueError(f"branching ({self.branching}) must be at most vocab ({self.vocab})")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {self.decay!r}")
        if not 0 <= self.copy_prob < 1:
            raise ValueError(f"copy_prob must be in [0, 1), got {self.copy_prob!r}")


def transition_matrix(spec: CorpusSpec = CorpusSpec(), seed: int = 0) -> torch.Tensor:
    """The Markov chain's ``(vocab, vocab)`` row-stochastic matrix: ``branching`` successors per token.

    Successor ``j`` (in a seeded random order) of each token has probability ``decay^j / sum_i decay^i``.
    """
    check_nonnegative_int("seed", seed)
    g = torch.Generator().manual_seed(seed)
    weights = spec.decay ** torch.arange(spec.branching, dtype=torch.float64)
    matrix = torch.zeros(spec.vocab, spec.vocab, dtype=torch.float64)
    for a in range(spec.vocab):
        successors = torch.randperm(spec.vocab, generator=g)[: spec.branching]
        matrix[a, successors] = weights / weights.sum()
    return matrix


def make_corpus(n_sequences: int, seq_len: int, spec: CorpusSpec = CorpusSpec(), seed: int = 0,
                chain_seed: int = 0) -> torch.Tensor:
    """``(n_sequences, seq_len)`` int64 tokens: the Markov chain of ``chain_seed`` with copied spans.

    ``seed`` draws the sequences, ``chain_seed`` the chain, so a held-out set is
    ``make_corpus(..., seed=other)`` with the same ``chain_seed``. A copy starts
    only once ``copy_len`` tokens exist, repeats a span that ends at least one
    token before the copy begins, and a sequence continues from the copied
    span's last token by the chain.
    """
    check_positive_int("n_sequences", n_sequences)
    check_positive_int("seq_len", seq_len)
    check_nonnegative_int("seed", seed)
    matrix = transition_matrix(spec, chain_seed)
    g = torch.Generator().manual_seed(seed)
    out = torch.empty(n_sequences, seq_len, dtype=torch.int64)
    for row in range(n_sequences):
        seq = [int(torch.randint(spec.vocab, (1,), generator=g))]
        while len(seq) < seq_len:
            room = len(seq) - spec.copy_len  # spans seq[s : s + copy_len] with s <= room - 1 end before the copy
            if room >= 1 and float(torch.rand((), generator=g)) < spec.copy_prob:
                start = int(torch.randint(room, (1,), generator=g))
                seq.extend(seq[start: start + spec.copy_len])
            else:
                seq.append(int(torch.multinomial(matrix[seq[-1]], 1, generator=g)))
        out[row] = torch.tensor(seq[:seq_len])
    return out


@train_once
def train_tiny_llama(config: LlamaConfig, steps: int = 200, seed: int = 0, spec: CorpusSpec = CorpusSpec(),
                     batch_size: int = 32, seq_len: int = 48, lr: float = 2e-3,
                     corpus: torch.Tensor | None = None) -> TinyLlama:
    """A :class:`TinyLlama` of ``config`` trained by AdamW on next-token cross-entropy; returned in eval mode.

    ``corpus`` defaults to ``make_corpus(max(8 * batch_size, 256), seq_len, spec, seed=seed)`` and each step
    samples ``batch_size`` of its rows. The learning rate warms up over the first 10 % of ``steps`` and
    decays by a cosine to 10 % of ``lr``. ``config.vocab`` must equal the corpus's vocabulary.

    Trained once per distinct call (:func:`utils.train_once.train_once`): part 5's pages and their
    tests share the target and the drafts, and a later call loads the stored model, bitwise the same.
    """
    check_positive_int("steps", steps)
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    check_positive("lr", lr, finite=True)
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2 (an input and a target), got {seq_len}")
    if corpus is None:
        corpus = make_corpus(max(8 * batch_size, 256), seq_len, spec, seed=seed)
    if corpus.dim() != 2 or corpus.shape[1] < 2:
        raise ValueError(f"corpus must be (n_sequences, seq_len >= 2) tokens, got shape {tuple(corpus.shape)}")
    if int(corpus.max()) >= config.vocab:
        raise ValueError(f"config.vocab ({config.vocab}) is smaller than the corpus's largest token + 1 "
                         f"({int(corpus.max()) + 1})")
    torch.manual_seed(seed)
    model = TinyLlama(config)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(seed + 1)
    warmup = max(1, steps // 10)
    for step in range(steps):
        scale = (step + 1) / warmup if step < warmup else \
            0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))
        for group in opt.param_groups:
            group["lr"] = lr * scale
        batch = corpus[torch.randint(corpus.shape[0], (batch_size,), generator=g)]
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, config.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return model.eval()


@torch.no_grad()
def evaluate(model: TinyLlama, tokens: torch.Tensor) -> dict[str, float]:
    """Held-out next-token ``loss`` (nats), ``perplexity`` ``= exp(loss)`` and greedy ``accuracy`` on ``tokens``.

    ``tokens`` is ``(n_sequences, seq_len >= 2)``; every position but the last predicts the next token.
    """
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError(f"tokens must be (n_sequences, seq_len >= 2), got shape {tuple(tokens.shape)}")
    logits = model(tokens[:, :-1])
    targets = tokens[:, 1:]
    loss = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)))
    accuracy = float((logits.argmax(-1) == targets).float().mean())
    return {"loss": loss, "perplexity": math.exp(loss), "accuracy": accuracy}
