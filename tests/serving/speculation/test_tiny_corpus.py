import pytest
import torch

from utils.attention.llama import LlamaConfig
from utils.serving.speculation.speculative import speculative_generate
from utils.serving.speculation.tiny_corpus import (DRAFT_CONFIGS, TARGET_CONFIG, CorpusSpec, evaluate, make_corpus,
                                       train_tiny_llama, transition_matrix)


def test_transition_matrix_is_sparse_and_stochastic():
    spec = CorpusSpec(vocab=16, branching=3, decay=0.5)
    m = transition_matrix(spec, seed=2)
    torch.testing.assert_close(m.sum(1), torch.ones(16, dtype=torch.float64))
    assert ((m > 0).sum(1) == 3).all()
    assert torch.allclose(m.sort(1, descending=True).values[:, :3], torch.tensor([4 / 7, 2 / 7, 1 / 7]).double())
    assert torch.equal(m, transition_matrix(spec, seed=2)) and not torch.equal(m, transition_matrix(spec, seed=3))


def test_corpus_is_deterministic_and_follows_chain_or_copies():
    spec = CorpusSpec()
    a, b = make_corpus(20, 48, spec, seed=5), make_corpus(20, 48, spec, seed=5)
    assert torch.equal(a, b) and not torch.equal(a, make_corpus(20, 48, spec, seed=6))
    assert a.shape == (20, 48) and a.dtype == torch.int64 and 0 <= a.min() and a.max() < spec.vocab
    m = transition_matrix(spec)
    off_chain = (m[a[:, :-1], a[:, 1:]] == 0).float().mean()  # transitions the chain never makes: copy jumps
    assert 0 < off_chain < 0.2
    no_copies = make_corpus(20, 48, CorpusSpec(copy_prob=0.0), seed=5)
    assert (m[no_copies[:, :-1], no_copies[:, 1:]] > 0).all()


def test_bad_specs():
    for kwargs in ({"vocab": 0}, {"branching": 100}, {"decay": 0.0}, {"copy_prob": 1.0}, {"copy_len": 0}):
        with pytest.raises(ValueError):
            CorpusSpec(**kwargs)
    with pytest.raises(ValueError, match="vocab"):
        train_tiny_llama(LlamaConfig(vocab=8, dim=16, n_layers=1, n_heads=2, n_kv_heads=2), steps=1)
    with pytest.raises(ValueError, match="seq_len"):
        evaluate(None, torch.zeros(3, 1, dtype=torch.int64))


def test_trained_target_beats_drafts_and_they_agree_partly():
    """The chapters' pair: the target has the lower held-out loss; greedy acceptance is neither ~0 nor ~1."""
    held = make_corpus(64, 48, seed=1)
    target = train_tiny_llama(TARGET_CONFIG)
    draft = train_tiny_llama(DRAFT_CONFIGS["1 layer, dim 32"])  # the pages' pair, trained once for all
    t_eval, d_eval = evaluate(target, held), evaluate(draft, held)
    assert t_eval["loss"] < d_eval["loss"] < torch.log(torch.tensor(64.0))
    drafted = accepted = 0
    for i in range(6):
        r = speculative_generate(target, draft, held[i, :12], 30, 4)
        drafted, accepted = drafted + sum(r.drafted), accepted + sum(r.accepted)
    assert 0.2 < accepted / drafted < 0.9
