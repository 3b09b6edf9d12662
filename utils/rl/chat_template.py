"""A toy chat template: a conversation as tokens, and the mask that keeps SFT's loss on the assistant's turns.

A chat model sees a conversation as one token sequence in which *special
tokens* mark who speaks. The template here renders each turn as

    <|role|> content <|end|>

with one special token per role and one end-of-turn token, and the content
tokenised one character per token (printable ASCII). Multi-turn SFT trains
only on what the assistant says: :func:`render` returns, beside the ids, a
mask that is true on the assistant's content and on the ``<|end|>`` that
closes its turn (the model must learn to stop), and false on the system and
user turns and on the ``<|assistant|>`` header (the template writes that, as
the generation prompt). :func:`masked_lm_loss` is the next-token
cross-entropy over masked targets only, which is what TRL's
``SFTConfig(assistant_only_loss=True)`` does with the ``assistant_masks`` a
Hugging Face tokenizer returns (``return_assistant_tokens_mask=True``, from
``{% generation %}`` markers in a Jinja template), by setting the other labels
to -100.

Content is tokenised character by character, so a user who *types*
``"<|end|>"`` gets seven character tokens, never the special token: the
template cannot be spoofed from inside a message.
"""

from __future__ import annotations

import string

import torch
import torch.nn.functional as F

ROLES = ("system", "user", "assistant")
"""The roles a turn may have."""
SPECIAL_TOKENS = tuple(f"<|{role}|>" for role in ROLES) + ("<|end|>",)
"""One header token per role, then the end-of-turn token; ids 0-3."""
END_ID = len(ROLES)
CHARACTERS = "".join(c for c in string.printable if c.isprintable())
"""Printable ASCII (space to ``~``): the characters content may use, ids 4 onwards."""
VOCAB = SPECIAL_TOKENS + tuple(CHARACTERS)
"""Token id -> token string."""
IGNORE_INDEX = -100
"""The label PyTorch's ``cross_entropy`` skips by default, and Hugging Face's and TRL's convention for masked labels."""

_CHAR_ID = {c: i + len(SPECIAL_TOKENS) for i, c in enumerate(CHARACTERS)}


def _check_messages(messages: list[dict[str, str]]) -> None:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"messages must be a non-empty list of {{'role', 'content'}} dicts, got {messages!r}")
    for i, turn in enumerate(messages):
        if not isinstance(turn, dict) or set(turn) != {"role", "content"}:
            raise ValueError(f"turn {i} must be a dict with exactly the keys 'role' and 'content', got {turn!r}")
        if turn["role"] not in ROLES:
            raise ValueError(f"turn {i} has role {turn['role']!r}; allowed roles are {ROLES}")
        if not isinstance(turn["content"], str):
            raise ValueError(f"turn {i}'s content must be a string, got {type(turn['content']).__name__}")
        bad = sorted(set(turn["content"]) - set(CHARACTERS))
        if bad:
            raise ValueError(f"turn {i}'s content may only use printable ASCII characters, got {bad!r}")


def render(messages: list[dict[str, str]], add_generation_prompt: bool = False) -> tuple[list[int], list[bool]]:
    """Token ids of the conversation and its assistant-only loss mask (one bool per token).

    Each turn is ``[<|role|>] + characters + [<|end|>]``; the mask is true on
    an assistant turn's characters and its ``<|end|>``. With
    ``add_generation_prompt`` a final ``<|assistant|>`` header is appended
    (masked out), the prompt a model continues at inference.
    """
    _check_messages(messages)
    ids: list[int] = []
    mask: list[bool] = []
    for turn in messages:
        trained = turn["role"] == "assistant"
        ids.append(ROLES.index(turn["role"]))
        mask.append(False)
        ids.extend(_CHAR_ID[c] for c in turn["content"])
        ids.append(END_ID)
        mask.extend([trained] * (len(turn["content"]) + 1))
    if add_generation_prompt:
        ids.append(ROLES.index("assistant"))
        mask.append(False)
    return ids, mask


def decode(ids) -> str:
    """Token ids back to text, special tokens written as their strings."""
    out = []
    for i in ids:
        i = int(i)
        if not 0 <= i < len(VOCAB):
            raise ValueError(f"token id must lie in [0, {len(VOCAB)}), got {i}")
        out.append(VOCAB[i])
    return "".join(out)


def masked_lm_loss(logits: torch.Tensor, ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the targets where ``loss_mask`` is true.

    ``logits`` is ``(..., T, V)`` from a causal model fed ``ids`` (``(..., T)``);
    position ``t`` predicts ``ids[t + 1]``, which counts when
    ``loss_mask[t + 1]`` is true: ``-sum_t m_{t+1} log p(ids_{t+1} | ids_{<=t}) / sum_t m_{t+1}``.
    """
    if ids.shape != loss_mask.shape or logits.shape[:-1] != ids.shape:
        raise ValueError(f"logits must be ids.shape + (vocab,) and loss_mask ids.shape, got logits "
                         f"{tuple(logits.shape)}, ids {tuple(ids.shape)}, loss_mask {tuple(loss_mask.shape)}")
    if loss_mask.dtype != torch.bool:
        raise ValueError(f"loss_mask must be a boolean tensor, got dtype {loss_mask.dtype}")
    targets = loss_mask[..., 1:]
    if not bool(targets.any()):
        raise ValueError("loss_mask selects no target token (the first position is never a target)")
    logp = torch.log_softmax(logits[..., :-1, :].float(), dim=-1)
    nll = -logp.gather(-1, ids[..., 1:, None]).squeeze(-1)
    return nll[targets].mean()
