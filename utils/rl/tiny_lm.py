"""A tiny character-level language model of one-digit sums, for the post-training labs.

The language: a prompt ``"a+b="`` (``a, b`` in 0-9, always 4 characters)
followed by a response, the sum's digits and an end mark ``"."`` (``"7+8=15."``).
The *pre-training corpus* is noisy on purpose: with probability ``noise`` the
written answer is off by 1 or 2, as a web corpus holds wrong arithmetic, so
the pre-trained model samples the right answer only part of the time. SFT,
GRPO and DPO then sharpen it (labs/04-rl/03 to 05).

The model is a 2-layer pre-norm decoder-only transformer (Vaswani et al. 2017;
GPT-2's layout, Radford et al. 2019) whose projections are plain ``nn.Linear``
modules named ``q, k, v, o, up, down, head``, so a LoRA can wrap them by name.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from utils.progress import progress
from utils.validate import check_nonnegative, check_positive, check_positive_int

VOCAB = "0123456789+=._"
"""Digits, ``+``, ``=``, the end mark ``.`` and the padding ``_`` (never sampled as content)."""
END, PAD = VOCAB.index("."), VOCAB.index("_")
PROMPT_LEN = 4
"""Every prompt ``"a+b="`` is 4 tokens long."""
MAX_RESPONSE = 3
"""At most two digits and the end mark."""
SEQ_LEN = PROMPT_LEN + MAX_RESPONSE
PAD_LOGIT = -1e9
"""The model's logit for padding: finite (so ``0 * log 0`` stays 0) but zero probability."""


def encode(text: str) -> list[int]:
    """Characters to token ids; raises ``ValueError`` on a character outside :data:`VOCAB`."""
    bad = sorted(set(text) - set(VOCAB))
    if bad:
        raise ValueError(f"text may only use the characters {VOCAB!r}, got {bad}")
    return [VOCAB.index(c) for c in text]


def decode(ids) -> str:
    """Token ids to characters, dropping padding."""
    return "".join(VOCAB[int(i)] for i in ids if int(i) != PAD)


def all_prompts() -> list[tuple[int, int]]:
    """The 100 problems ``(a, b)``, ``a, b`` in 0-9, in order."""
    return [(a, b) for a in range(10) for b in range(10)]


def prompt_tokens(problems: list[tuple[int, int]]) -> torch.Tensor:
    """``(len(problems), 4)`` token ids of the prompts ``"a+b="``."""
    return torch.tensor([encode(f"{a}+{b}=") for a, b in problems])


def pad_sequence(text: str) -> list[int]:
    """``text`` (prompt and response) as ids padded with ``_`` to :data:`SEQ_LEN`."""
    ids = encode(text)
    if len(ids) > SEQ_LEN:
        raise ValueError(f"{text!r} is longer than {SEQ_LEN} tokens")
    return ids + [PAD] * (SEQ_LEN - len(ids))


def arithmetic_corpus(n: int, noise: float = 0.5, seed: int = 0,
                      problems: list[tuple[int, int]] | None = None) -> torch.Tensor:
    """``(n, SEQ_LEN)`` token ids of ``"a+b=c."``; with probability ``noise`` the answer is off by +-1 or +-2.

    ``problems`` restricts the prompts (default: all 100); wrong answers that
    would be negative are replaced by the correct one.
    """
    check_positive_int("n", n)
    if not 0 <= noise <= 1:
        raise ValueError(f"noise must lie in [0, 1], got {noise!r}")
    problems = problems or all_prompts()
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(problems), (n,), generator=g).tolist()
    wrong = (torch.rand(n, generator=g) < noise).tolist()
    offsets = torch.tensor([-2, -1, 1, 2])[torch.randint(4, (n,), generator=g)].tolist()
    rows = []
    for pick, is_wrong, offset in zip(picks, wrong, offsets):
        a, b = problems[pick]
        answer = a + b + offset if is_wrong and a + b + offset >= 0 else a + b
        rows.append(pad_sequence(f"{a}+{b}={answer}."))
    return torch.tensor(rows)


def corpus_right_answer_share(noise: float = 0.5, problems: list[tuple[int, int]] | None = None) -> float:
    """Probability that a perfect fit of :func:`arithmetic_corpus` samples the right answer at temperature 1.

    Per problem the right answer has probability ``1 - noise + noise * k / 4``,
    where ``k`` counts the offsets of ``-2, -1, +1, +2`` that would make the
    answer negative (the corpus writes the right one instead); averaged over
    the problems, which the corpus draws uniformly. For all 100 problems and
    ``noise = 0.5``: ``(0.75 + 2 * 0.625 + 97 * 0.5) / 100 = 0.505``.
    """
    if not 0 <= noise <= 1:
        raise ValueError(f"noise must lie in [0, 1], got {noise!r}")
    problems = problems or all_prompts()
    shares = [1 - noise + noise * sum(a + b + d < 0 for d in (-2, -1, 1, 2)) / 4 for a, b in problems]
    return sum(shares) / len(shares)


class Block(nn.Module):
    """Pre-norm attention and MLP, each added to the residual stream."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))
        self.up, self.down = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln1(x)
        q, k, v = (proj(h).view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TinyLM(nn.Module):
    """A decoder-only transformer over :data:`VOCAB`: ``(batch, time)`` ids to ``(batch, time, vocab)`` logits."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, n_layers: int = 2, seed: int = 0):
        super().__init__()
        for name, value in (("d_model", d_model), ("n_heads", n_heads), ("n_layers", n_layers)):
            check_positive_int(name, value)
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be a multiple of n_heads ({n_heads})")
        torch.manual_seed(seed)
        self.embed, self.pos = nn.Embedding(len(VOCAB), d_model), nn.Embedding(SEQ_LEN, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, len(VOCAB))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return logits.masked_fill(torch.arange(logits.shape[-1], device=ids.device) == PAD, PAD_LOGIT)


def response_mask(sequences: torch.Tensor) -> torch.Tensor:
    """``(batch, MAX_RESPONSE)`` booleans: which response positions are real tokens (up to and with the end mark)."""
    response = sequences[:, PROMPT_LEN:]
    ended_before = torch.cumsum((response == END).long(), dim=1) - (response == END).long()
    return (ended_before == 0) & (response != PAD)


def token_logprobs(model: nn.Module, sequences: torch.Tensor) -> torch.Tensor:
    """``(batch, MAX_RESPONSE)``: ``log pi(y_t | x, y_<t)`` of each response token (garbage where the mask is 0),
    computed in fp32 (fp64 for an fp64 model)."""
    logits = model(sequences[:, :-1])[:, PROMPT_LEN - 1:]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp32, or fp64 for an fp64 model
    return torch.log_softmax(logits, -1).gather(-1, sequences[:, PROMPT_LEN:, None]).squeeze(-1)


def sequence_logprob(model: nn.Module, sequences: torch.Tensor) -> torch.Tensor:
    """``(batch,)``: ``log pi(y | x) = sum_t log pi(y_t | x, y_<t)`` over the response's real tokens."""
    return torch.where(response_mask(sequences), token_logprobs(model, sequences), 0.0).sum(-1)


@torch.no_grad()
def sample(model: nn.Module, prompts: torch.Tensor, temperature: float = 1.0,
           generator: torch.Generator | None = None,
           share_prefixes: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample responses: ``(sequences (batch, SEQ_LEN), token log-probs (batch, MAX_RESPONSE))``.

    Tokens are drawn from ``softmax(logits / temperature)`` (``temperature = 0``:
    greedy); the log-probs returned are those of the temperature-1 policy, the
    ones the RL objectives need. After the end mark every position is padding.

    ``share_prefixes=True`` runs the model once per *distinct* row so far (many samples of one
    prompt share a forward: 400 samples of one problem need a handful of rows, not 400) and
    draws from the same generator in the same order. The law is the same; the logits' last bits
    may differ from a full batch's (a BLAS may round differently for another number of rows), so
    on rare draws a token can differ from the default's.
    """
    check_nonnegative("temperature", temperature)
    if prompts.dim() != 2 or prompts.shape[1] != PROMPT_LEN:
        raise ValueError(f"prompts must be (batch, {PROMPT_LEN}) token ids, got {tuple(prompts.shape)}")
    if not isinstance(share_prefixes, bool):
        raise ValueError(f"share_prefixes must be True or False, got {share_prefixes!r}")
    seq, logps = prompts.clone(), []
    done = torch.zeros(len(prompts), dtype=torch.bool, device=prompts.device)
    for _ in range(MAX_RESPONSE):
        if share_prefixes:
            rows, inverse = torch.unique(seq, dim=0, return_inverse=True)
            logp = torch.log_softmax(model(rows)[:, -1].float(), -1)[inverse]
        else:
            logp = torch.log_softmax(model(seq)[:, -1].float(), -1)
        if temperature == 0:
            token = logp.argmax(-1)
        else:
            probs = torch.softmax(logp / temperature, -1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        token = torch.where(done, torch.full_like(token, PAD), token)
        logps.append(torch.where(done, torch.zeros_like(token, dtype=logp.dtype),
                                 logp.gather(-1, token[:, None]).squeeze(-1)))
        seq = torch.cat([seq, token[:, None]], 1)
        done = done | (token == END)
    return seq, torch.stack(logps, 1)


def train_lm(model: nn.Module, sequences: torch.Tensor, steps: int, lr: float = 3e-3, batch_size: int = 128,
             response_only: bool = False, seed: int = 0, desc: str = "train") -> list[float]:
    """Next-token cross-entropy with AdamW on the trainable parameters; returns the loss of each step.

    ``response_only=True`` is SFT's loss (prompt tokens are given, not
    predicted); otherwise every real next token counts (pre-training).
    """
    check_positive_int("steps", steps)
    check_positive("lr", lr)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no trainable parameters")
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in progress(range(steps), desc, mininterval=5):
        batch = sequences[torch.randint(len(sequences), (batch_size,), generator=g)]
        logits = model(batch[:, :-1])
        targets = batch[:, 1:].clone()
        targets[targets == PAD] = -100
        if response_only:
            targets[:, :PROMPT_LEN - 1] = -100
            targets[:, PROMPT_LEN - 1:][~response_mask(batch)] = -100
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
