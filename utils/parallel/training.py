"""How much compute training a transformer takes, and how long a cluster needs for it.

Training a dense transformer of ``N`` parameters on ``D`` tokens costs about
``C = 6 N D`` floating-point operations (Kaplan et al., "Scaling Laws for
Neural Language Models", arXiv:2001.08361, section 2.1): every parameter
takes part in one multiply-add (2 FLOPs) per token in the forward pass, and
in two in the backward pass (the gradient with respect to the layer's input
and the one with respect to the weight: 4 FLOPs). The attention scores add
``2 n_layer n_ctx d_model`` per token in the forward pass, which the formula
leaves out (small while ``d_model`` is large compared with ``n_ctx / 12``).

A cluster of ``n_gpus`` GPUs with a peak of ``P`` FLOP/s each delivers
``n_gpus * P * MFU``, where the *model FLOPs utilization* (MFU) is the fraction
of peak that goes into those ``6 N D`` model FLOPs (Chowdhery et al., "PaLM:
Scaling Language Modeling with Pathways", arXiv:2204.02311, section 4.1 and
appendix B). Recomputed activations do not count as model FLOPs.

Published figures used to check these formulas are in :data:`PUBLISHED`; the
peak FLOP/s of GPUs are in :data:`utils.gpu.hardware.GPUS`.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from utils.published import Published
from utils.validate import check_positive, check_positive_int

FORWARD_FLOPS_PER_PARAM_PER_TOKEN = 2
"""One multiply and one add per parameter per token (Kaplan et al., arXiv:2001.08361, section 2.1)."""

BACKWARD_FLOPS_PER_PARAM_PER_TOKEN = 4
"""Twice the forward pass: input gradient plus weight gradient (Kaplan et al., section 2.1)."""

TRAINING_FLOPS_PER_PARAM_PER_TOKEN = FORWARD_FLOPS_PER_PARAM_PER_TOKEN + BACKWARD_FLOPS_PER_PARAM_PER_TOKEN

SECONDS_PER_DAY = 86_400.0
SECONDS_PER_YEAR = 365.25 * SECONDS_PER_DAY


_GPT3 = "Brown et al., 'Language Models are Few-Shot Learners', arXiv:2005.14165"
_LLAMA = "Touvron et al., 'LLaMA: Open and Efficient Foundation Language Models', arXiv:2302.13971"
_PALM = "Chowdhery et al., 'PaLM: Scaling Language Modeling with Pathways', arXiv:2204.02311"

PUBLISHED: Mapping[str, Published] = MappingProxyType({
    "gpt3_175b_params": Published(174.6e9, "parameters", _GPT3 + ", Table D.1 (174,600M)"),
    "gpt3_175b_tokens": Published(300e9, "tokens", _GPT3 + ", Table D.1"),
    "gpt3_175b_train_flops": Published(3.14e23, "FLOPs", _GPT3 + ", Table D.1 (total train compute)"),
    "llama_65b_params": Published(65.2e9, "parameters", _LLAMA + ", Table 2"),
    "llama_65b_tokens": Published(1.4e12, "tokens", _LLAMA + ", Table 2"),
    "llama_65b_gpus": Published(2048, "A100-80GB GPUs", _LLAMA + ", section 2.4"),
    "llama_65b_days": Published(21, "days", _LLAMA + ", section 2.4 ('approximately 21 days')"),
    "llama_65b_tokens_per_s_per_gpu": Published(380, "tokens/s/GPU", _LLAMA + ", section 2.4 ('around 380')"),
    "palm_540b_mfu": Published(0.462, "fraction of peak", _PALM + ", Table 3"),
})
"""Published training runs the formulas of this module are checked against."""


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        check_positive(name, value)


def forward_flops(n_params: float, n_tokens: float) -> float:
    """FLOPs of the forward passes over ``n_tokens`` tokens: ``2 N D`` (Kaplan et al., arXiv:2001.08361)."""
    _check_positive(n_params=n_params, n_tokens=n_tokens)
    return FORWARD_FLOPS_PER_PARAM_PER_TOKEN * float(n_params) * float(n_tokens)


def backward_flops(n_params: float, n_tokens: float) -> float:
    """FLOPs of the backward passes over ``n_tokens`` tokens: ``4 N D``, twice the forward pass (Kaplan et al.)."""
    _check_positive(n_params=n_params, n_tokens=n_tokens)
    return BACKWARD_FLOPS_PER_PARAM_PER_TOKEN * float(n_params) * float(n_tokens)


def training_flops(n_params: float, n_tokens: float) -> float:
    """FLOPs to train ``n_params`` parameters on ``n_tokens`` tokens: ``C = 6 N D``.

    Kaplan et al., "Scaling Laws for Neural Language Models", arXiv:2001.08361,
    section 2.1 (attention-score FLOPs neglected). GPT-3 175B on 300B tokens
    gives 3.14e23, as printed in Brown et al., arXiv:2005.14165, Table D.1.
    """
    return forward_flops(n_params, n_tokens) + backward_flops(n_params, n_tokens)


def training_seconds(flops: float, n_gpus: int, peak_flops_per_gpu: float, mfu: float) -> float:
    """Wall-clock seconds to do ``flops`` model FLOPs: ``flops / (n_gpus * peak_flops_per_gpu * mfu)``.

    ``peak_flops_per_gpu`` is the datasheet's dense peak in FLOP/s for the
    precision used; ``mfu`` (0 < mfu <= 1) is the model FLOPs utilization
    (Chowdhery et al., arXiv:2204.02311, appendix B).
    """
    _check_positive(flops=flops, peak_flops_per_gpu=peak_flops_per_gpu, mfu=mfu)
    check_positive_int("n_gpus", n_gpus)
    if mfu > 1:
        raise ValueError(f"mfu is a fraction of peak and must be in (0, 1], got {mfu}")
    return float(flops) / (n_gpus * float(peak_flops_per_gpu) * float(mfu))


def model_flops_utilization(n_params: float, n_tokens: float, seconds: float, n_gpus: int,
                            peak_flops_per_gpu: float) -> float:
    """MFU of a measured run that trained on ``n_tokens`` tokens in ``seconds``: ``6 N D / (seconds * n_gpus * P)``.

    The observed model FLOP/s over the peak the hardware could deliver
    (Chowdhery et al., "PaLM", arXiv:2204.02311, appendix B). A result above 1
    means the peak or the measurement is wrong; it is returned, not clipped.
    For a throughput of ``t`` tokens/s per GPU, pass ``n_tokens=t, seconds=1, n_gpus=1``.
    """
    _check_positive(seconds=seconds, peak_flops_per_gpu=peak_flops_per_gpu)
    check_positive_int("n_gpus", n_gpus)
    return training_flops(n_params, n_tokens) / (float(seconds) * n_gpus * float(peak_flops_per_gpu))
