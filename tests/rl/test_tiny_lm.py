import pytest
import torch

from utils.rl.tiny_lm import (END, PAD, PROMPT_LEN, SEQ_LEN, TinyLM, all_prompts, arithmetic_corpus,
                              corpus_right_answer_share, decode, encode,
                              prompt_tokens, response_mask, sample, sequence_logprob, token_logprobs, train_lm)


def test_encode_decode_round_trip_and_rejects_unknown_characters():
    assert decode(encode("7+8=15.")) == "7+8=15."
    with pytest.raises(ValueError, match="characters"):
        encode("7*8=56.")


def test_corpus_noise_rate_and_clean_corpus_is_correct():
    def correct(row):
        text = decode(row)
        a, b = int(text[0]), int(text[2])
        return text[PROMPT_LEN:] == f"{a + b}."
    clean = arithmetic_corpus(500, noise=0.0, seed=3)
    assert all(correct(r) for r in clean)
    noisy = arithmetic_corpus(4000, noise=0.5, seed=3)
    wrong = 1 - sum(correct(r) for r in noisy) / len(noisy)
    assert 0.4 < wrong < 0.5  # 0.5, less the few negative answers put back to the correct one


def test_response_mask_stops_after_the_end_mark():
    seq = torch.tensor([encode("1+2=3._"), encode("9+9=18."), encode("1+1=.") + [PAD, PAD]])
    assert response_mask(seq).tolist() == [[True, True, False], [True, True, True], [True, False, False]]


def test_sampled_log_probs_match_a_forward_pass():
    model = TinyLM(d_model=32, n_heads=2, seed=1)
    prompts = prompt_tokens(all_prompts()[:20])
    seq, logps = sample(model, prompts, generator=torch.Generator().manual_seed(0))
    assert seq.shape == (20, SEQ_LEN) and torch.equal(seq[:, :PROMPT_LEN], prompts)
    mask = response_mask(seq)
    torch.testing.assert_close(logps[mask], token_logprobs(model, seq)[mask])
    torch.testing.assert_close(torch.where(mask, logps, 0.0).sum(-1), sequence_logprob(model, seq))
    assert (seq[~torch.cat([torch.ones(20, PROMPT_LEN, dtype=torch.bool), mask], 1)] == PAD).all()


def test_sequence_logprob_sums_to_one_over_all_responses_of_a_prompt():
    """Enumerate every response of <= 3 tokens ending in '.': their probabilities sum to 1 (no mass on padding)."""
    model = TinyLM(d_model=32, n_heads=2, seed=2)
    content = [i for i in range(14) if i not in (END, PAD)]
    responses = [[END, PAD, PAD]] + [[a, END, PAD] for a in content] + [[a, b, END] for a in content for b in content]
    responses += [[a, b, c] for a in content for b in content for c in content]  # cut off at 3 tokens, no end mark
    seq = torch.cat([prompt_tokens([(3, 4)]).repeat(len(responses), 1), torch.tensor(responses)], 1)
    with torch.no_grad():
        total = sequence_logprob(model, seq).exp().sum()
    assert total.item() == pytest.approx(1.0, abs=1e-4)


def test_sampling_is_deterministic_with_a_seeded_generator():
    model = TinyLM(d_model=32, n_heads=2, seed=1)
    prompts = prompt_tokens(all_prompts()[:10])
    a, _ = sample(model, prompts, generator=torch.Generator().manual_seed(5))
    b, _ = sample(model, prompts, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


def test_shared_prefixes_sample_as_the_full_batch_does():
    model = TinyLM(d_model=32, n_heads=2, seed=1)
    prompts = prompt_tokens([(2, 5)] * 60 + [(7, 8)] * 40)
    full, full_logps = sample(model, prompts, generator=torch.Generator().manual_seed(5))
    shared, shared_logps = sample(model, prompts, generator=torch.Generator().manual_seed(5), share_prefixes=True)
    assert torch.equal(full, shared)  # the same draws from the same generator (up to a last-bit tie: never here)
    torch.testing.assert_close(full_logps, shared_logps)
    with pytest.raises(ValueError, match="share_prefixes"):
        sample(model, prompts, share_prefixes=1)


def test_pretraining_learns_the_clean_answers():
    model = TinyLM(d_model=32, n_heads=2, seed=0)
    data = arithmetic_corpus(2000, noise=0.0, seed=0, problems=all_prompts()[:10])
    losses = train_lm(model, data, steps=120, lr=1e-2, batch_size=64)
    assert losses[-1] < 0.5 * losses[0]
    greedy, _ = sample(model, prompt_tokens(all_prompts()[:10]), temperature=0)
    assert sum(decode(r[PROMPT_LEN:]) == f"{a + b}." for r, (a, b) in zip(greedy, all_prompts()[:10])) >= 9


def test_a_perfect_fit_of_the_corpus_samples_the_right_answer_0_505_of_the_time():
    """Half right, plus the wrong answers that would be negative for a + b = 0 (two) and a + b = 1 (one, twice)."""
    assert corpus_right_answer_share(0.5) == pytest.approx(0.505)
    assert corpus_right_answer_share(0.0) == 1.0
    corpus = arithmetic_corpus(20_000, noise=0.5, seed=0)
    right = sum(decode(row).split("=")[1].rstrip("._") == str(int(decode(row)[0]) + int(decode(row)[2]))
                for row in corpus.tolist())
    assert right / len(corpus) == pytest.approx(0.505, abs=0.01)  # the lab's corpus: 0.506
    with pytest.raises(ValueError, match="noise"):
        corpus_right_answer_share(1.5)
