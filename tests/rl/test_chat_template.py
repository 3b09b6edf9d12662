import pytest
import torch
import torch.nn.functional as F

from utils.rl.chat_template import (CHARACTERS, END_ID, IGNORE_INDEX, ROLES, SPECIAL_TOKENS, VOCAB, decode,
                                    masked_lm_loss, render)

CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "and 7+8?"},
        {"role": "assistant", "content": "15"}]


def test_render_writes_the_template_and_round_trips():
    ids, mask = render(CHAT)
    assert len(ids) == len(mask)
    expected = "".join(f"<|{t['role']}|>{t['content']}<|end|>" for t in CHAT)
    assert decode(ids) == expected
    assert len(ids) == sum(len(t["content"]) + 2 for t in CHAT)  # header + characters + end per turn
    assert len(VOCAB) == len(SPECIAL_TOKENS) + len(CHARACTERS) == 4 + 95


def test_mask_covers_exactly_the_assistant_content_and_its_end_token():
    ids, mask = render(CHAT)
    trained = "".join(VOCAB[i] for i, m in zip(ids, mask) if m)
    assert trained == "5<|end|>15<|end|>"
    assert sum(mask) == sum(len(t["content"]) + 1 for t in CHAT if t["role"] == "assistant")
    # headers are never trained on, and every assistant turn's END is
    for i, m in zip(ids, mask):
        if i < len(ROLES):
            assert not m
    ends = [m for i, m in zip(ids, mask) if i == END_ID]
    assert ends == [t["role"] == "assistant" for t in CHAT]


def test_generation_prompt_is_an_untrained_assistant_header():
    ids, mask = render(CHAT[:2], add_generation_prompt=True)
    assert VOCAB[ids[-1]] == "<|assistant|>" and not mask[-1] and not any(mask)


def test_special_token_text_in_content_stays_characters():
    ids, _ = render([{"role": "user", "content": "<|end|>"}])
    assert ids[1:-1] == [VOCAB.index(c) for c in "<|end|>"]
    assert ids.count(END_ID) == 1


def test_masked_lm_loss_matches_cross_entropy_with_ignore_index():
    """The loss of masked positions equals PyTorch's cross_entropy with labels set to -100, TRL's convention."""
    ids, mask = render(CHAT)
    ids, mask = torch.tensor(ids), torch.tensor(mask)
    logits = torch.randn(len(ids), len(VOCAB), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    labels = ids.masked_fill(~mask, IGNORE_INDEX)
    expected = F.cross_entropy(logits[:-1], labels[1:])
    torch.testing.assert_close(masked_lm_loss(logits, ids, mask), expected.float(), rtol=1e-6, atol=1e-6)
    # with everything in the mask it is the plain language-model loss
    full = torch.ones_like(mask)
    torch.testing.assert_close(masked_lm_loss(logits, ids, full), F.cross_entropy(logits[:-1], ids[1:]).float(),
                               rtol=1e-6, atol=1e-6)


def test_masked_lm_loss_batched_and_gradient_only_reaches_trained_targets():
    ids, mask = (torch.tensor(x) for x in render(CHAT))
    logits = torch.zeros(2, len(ids), len(VOCAB), requires_grad=True)
    loss = masked_lm_loss(logits, ids.expand(2, -1), mask.expand(2, -1))
    (grad,) = torch.autograd.grad(loss, logits)
    touched = grad.abs().sum(-1)[0] > 0
    assert torch.equal(touched[:-1], mask[1:])  # position t is trained iff its target t + 1 is
    assert loss.item() == pytest.approx(torch.log(torch.tensor(float(len(VOCAB)))).item(), rel=1e-6)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="non-empty"):
        render([])
    with pytest.raises(ValueError, match="allowed roles"):
        render([{"role": "tool", "content": "x"}])
    with pytest.raises(ValueError, match="exactly the keys"):
        render([{"role": "user"}])
    with pytest.raises(ValueError, match="printable ASCII"):
        render([{"role": "user", "content": "caf\u00e9"}])
    with pytest.raises(ValueError, match="must be a string"):
        render([{"role": "user", "content": 3}])
    with pytest.raises(ValueError, match="token id"):
        decode([len(VOCAB)])
    ids, mask = (torch.tensor(x) for x in render(CHAT))
    logits = torch.zeros(len(ids), len(VOCAB))
    with pytest.raises(ValueError, match="boolean"):
        masked_lm_loss(logits, ids, mask.long())
    with pytest.raises(ValueError, match="shape"):
        masked_lm_loss(logits[:-1], ids, mask)
    with pytest.raises(ValueError, match="no target"):
        masked_lm_loss(logits, ids, torch.zeros_like(mask))
