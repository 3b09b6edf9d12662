"""utils.attention.rope_scaling against the published formulas: PI, NTK-aware, YaRN (as DeepSeek-V2 sets it), Llama 3.1."""

import math

import pytest
import torch

from utils.attention.rope import rope_frequencies
from utils.attention.rope_scaling import (KINDS, linear_frequencies, llama3_frequencies, ntk_frequencies,
                                          scaled_frequencies, yarn_correction_dim, yarn_frequencies)


def meta_apply_scaling(freqs: list[float], scale_factor=8, low_freq_factor=1, high_freq_factor=4,
                       old_context_len=8192) -> list[float]:
    """Meta's llama-models ``apply_scaling`` (Llama 3.1), one frequency at a time, as published."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    new_freqs = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            new_freqs.append(freq)
        elif wavelen > low_freq_wavelen:
            new_freqs.append(freq / scale_factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            new_freqs.append((1 - smooth) * freq / scale_factor + smooth * freq)
    return new_freqs


def test_position_interpolation_divides_every_frequency():
    torch.testing.assert_close(linear_frequencies(64, 10000.0, 4.0), rope_frequencies(64, 10000.0) / 4)


def test_ntk_keeps_the_fastest_pair_and_slows_the_slowest_by_the_factor():
    theta, ntk = rope_frequencies(128, 10000.0), ntk_frequencies(128, 10000.0, 8.0)
    assert ntk[0] == theta[0] == 1
    assert float(ntk[-1]) == pytest.approx(float(theta[-1]) / 8, rel=1e-12)
    assert (ntk <= theta).all() and (ntk >= theta / 8 * (1 - 1e-12)).all()


def test_llama3_matches_metas_loop_and_its_three_bands():
    theta = rope_frequencies(128, 500000.0)
    scaled = llama3_frequencies(128)                       # Llama 3.1: base 500000, factor 8, low 1, high 4, 8192
    torch.testing.assert_close(scaled, torch.tensor(meta_apply_scaling(theta.tolist()), dtype=torch.float64))
    wavelength = 2 * math.pi / theta
    assert torch.equal(scaled[wavelength < 2048], theta[wavelength < 2048])
    torch.testing.assert_close(scaled[wavelength > 8192], theta[wavelength > 8192] / 8)
    # at base 500000, d = 128: pairs 0-28 are kept, 29-34 blended, 35-63 divided by 8
    assert (wavelength < 2048).sum() == 29 and (wavelength > 8192).sum() == 29


def test_yarn_correction_dims_solve_for_the_number_of_turns():
    for turns in (1.0, 32.0):
        i = yarn_correction_dim(turns, 64, 10000.0, 4096)
        assert 4096 * 10000.0 ** (-2 * i / 64) == pytest.approx(2 * math.pi * turns)


def test_yarn_as_deepseek_v2_sets_it():
    """DeepSeek-V2 (arXiv:2405.04434, section 3.1.4): YaRN on the 64-dim decoupled RoPE key, s = 40, alpha = 1,
    beta = 32, from a 4K context."""
    theta = rope_frequencies(64, 10000.0)
    scaled, attention_factor = yarn_frequencies(64, 10000.0, 40.0, 4096, mscale=0.707)
    turns = 4096 * theta / (2 * math.pi)
    fast, slow = turns > 32, turns < 1                     # the paper: keep pairs turning > beta times, divide < alpha
    assert fast.sum() == 11 and slow.sum() == 9
    assert torch.equal(scaled[fast], theta[fast])
    torch.testing.assert_close(scaled[slow], theta[slow] / 40)
    assert (scaled.diff() < 0).all() and (scaled <= theta).all() and (scaled >= theta / 40 * (1 - 1e-12)).all()
    # its config.json's mscale 0.707: sqrt(1/t) = 0.0707 ln 40 + 1, a softmax scale of its square in its code
    assert attention_factor == pytest.approx(1.2608, abs=1e-4) and attention_factor ** 2 == pytest.approx(1.5897, abs=1e-4)
    # YaRN's paper (mscale 1): 0.1 ln s + 1
    assert yarn_frequencies(64, 10000.0, 40.0, 4096)[1] == pytest.approx(1.3689, abs=1e-4)
    with pytest.raises(ValueError, match="mscale must be positive"):
        yarn_frequencies(64, 10000.0, 40.0, 4096, mscale=0.0)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_slows_or_keeps_each_pair(kind):
    theta, scaled = rope_frequencies(128, 10000.0), scaled_frequencies(kind, 128, 10000.0, 8.0, 4096)
    assert scaled.shape == (64,) and (scaled <= theta * (1 + 1e-12)).all() and (scaled >= theta / 8 * (1 - 1e-12)).all()
    if kind == "default":
        assert torch.equal(scaled, theta)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="factor extends the context"):
        linear_frequencies(8, 10000.0, 0.5)
    with pytest.raises(ValueError, match="kind must be one of"):
        scaled_frequencies("rope2", 8)
    with pytest.raises(ValueError, match="high_freq_factor > low_freq_factor"):
        llama3_frequencies(8, low_freq_factor=4.0, high_freq_factor=1.0)
    with pytest.raises(ValueError, match="beta_fast > beta_slow"):
        yarn_frequencies(8, 10000.0, 4.0, 4096, beta_fast=1.0, beta_slow=2.0)
