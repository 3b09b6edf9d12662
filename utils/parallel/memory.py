"""How many bytes a model's training state and activations take on each GPU, and what sharding costs in traffic.

Mixed-precision training with Adam keeps, per parameter, an fp16 weight
(2 bytes), an fp16 gradient (2 bytes) and ``K`` bytes of optimizer state: an
fp32 master weight, momentum and variance, ``K = 12`` (Rajbhandari et al.,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
arXiv:1910.02054, section 3.1). ZeRO's three stages shard, in turn, the
optimizer state, the gradients and the parameters across the ``N_d``
data-parallel GPUs (section 5); stage 0 here means plain data parallelism.

Activations are the other half of the bill: :func:`activation_bytes_per_layer`
is Table 2 of Korthikanti et al. 2022, with tensor and sequence parallelism
and selective or full recomputation.

Published figures these calculators reproduce are collected in
:data:`ZERO_PAPER_FIGURES` (the tests check every one).
"""

from __future__ import annotations

from typing import NamedTuple

from utils.published import Published
from utils.validate import check_element_size, check_nonnegative, check_positive, check_positive_int

ZERO_STAGES = (0, 1, 2, 3)

FP16_PARAM_BYTES = 2
"""Bytes of one fp16 (or bf16) parameter."""
FP16_GRAD_BYTES = 2
"""Bytes of one fp16 (or bf16) gradient."""
ADAM_MIXED_PRECISION_OPTIMIZER_BYTES = 12
"""K for mixed-precision Adam: fp32 master weight + fp32 momentum + fp32 variance = 4 + 4 + 4 (ZeRO, section 3.1)."""

_ZERO = "Rajbhandari et al., 'ZeRO: Memory Optimizations Toward Training Trillion Parameter Models', arXiv:1910.02054"
_GB = "GB of model state per GPU (1 GB = 1e9 bytes)"

ZERO_PAPER_FIGURES: tuple[tuple[str, float, int, int, Published], ...] = (
    # (what, n_params, n_gpus, stage, the published figure)
    ("7.5B model, baseline DP", 7.5e9, 64, 0, Published(120.0, _GB, _ZERO + ", Figure 1")),
    ("7.5B model, P_os", 7.5e9, 64, 1, Published(31.4, _GB, _ZERO + ", Figure 1")),
    ("7.5B model, P_os+g", 7.5e9, 64, 2, Published(16.6, _GB, _ZERO + ", Figure 1")),
    ("7.5B model, P_os+g+p", 7.5e9, 64, 3, Published(1.9, _GB, _ZERO + ", Figure 1")),
    ("1T model on 1024 GPUs, P_os+g+p", 1e12, 1024, 3, Published(15.6, _GB, _ZERO + ", section 5.4, Table 1")),
)
"""Model-state GB per GPU published in the ZeRO paper (mixed-precision Adam, K = 12), with the case it is for."""

ZERO_PAPER_LARGEST_MODELS_64_GPUS: tuple[tuple[int, Published], ...] = tuple(
    (stage, Published(n_params, "parameters, the largest model whose states fit on 64 GPUs of 32 GB",
                      _ZERO + ", section 5.4"))
    for stage, n_params in ((1, 7.5e9), (2, 14e9), (3, 128e9))
)
"""(stage, figure): ZeRO section 5.4, "with N_d = 64, ZeRO can train models with up to 7.5B, 14B, and 128B
parameters using P_os, P_os+g, and P_os+g+p", on 32 GB V100 GPUs, counting model states only."""


class ModelStateBytes(NamedTuple):
    """Model-state bytes on one GPU, by kind; ``total`` is their sum."""

    params: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def _check_stage(stage: int) -> None:
    if stage not in ZERO_STAGES or isinstance(stage, bool):
        raise ValueError(f"stage must be one of {ZERO_STAGES} (0 = plain data parallelism), got {stage!r}")


def zero_model_state_breakdown(
    n_params: float, n_gpus: int, stage: int, optimizer_bytes_per_param: float = 12,
    grad_bytes_per_param: float = FP16_GRAD_BYTES,
) -> ModelStateBytes:
    """Parameter, gradient and optimizer-state bytes per GPU under ZeRO ``stage``.

    With Psi parameters, K optimizer bytes per parameter and N_d GPUs (ZeRO
    paper, Figure 1 and section 5): parameters ``2 Psi``, gradients ``2 Psi``,
    optimizer ``K Psi``; stage >= 1 divides the optimizer term by N_d, stage
    >= 2 also the gradients, stage 3 also the parameters.
    ``grad_bytes_per_param`` is 2 in the ZeRO paper's fp16 recipe (2 + 2 + 12
    = 16 bytes); runs that keep bf16 weights but accumulate gradients in fp32
    pass 4 (Megatron-LM's distributed-optimizer docs: 18 bytes per parameter
    for "bf16 param, fp32 grads"; Llama 3, section 3.3.2).
    """
    check_positive("n_params", n_params)
    check_positive_int("n_gpus", n_gpus)
    _check_stage(stage)
    check_nonnegative("optimizer_bytes_per_param", optimizer_bytes_per_param)
    check_positive("grad_bytes_per_param", grad_bytes_per_param)
    psi, k, nd = float(n_params), float(optimizer_bytes_per_param), n_gpus
    params, grads, optim = FP16_PARAM_BYTES * psi, float(grad_bytes_per_param) * psi, k * psi
    if stage >= 1:
        optim /= nd
    if stage >= 2:
        grads /= nd
    if stage >= 3:
        params /= nd
    return ModelStateBytes(params, grads, optim)


def zero_model_state_bytes(n_params: float, n_gpus: int, stage: int, optimizer_bytes_per_param: float = 12) -> float:
    """Model-state bytes per GPU under ZeRO ``stage`` with ``n_gpus``-way data parallelism.

    With Psi parameters, K optimizer bytes per parameter and N_d GPUs
    (ZeRO paper, Figure 1):

    - stage 0 (plain data parallelism): ``(2 + 2 + K) Psi``
    - stage 1 (optimizer states sharded): ``2 Psi + 2 Psi + K Psi / N_d``
    - stage 2 (+ gradients sharded): ``2 Psi + (2 + K) Psi / N_d``
    - stage 3 (+ parameters sharded): ``(2 + 2 + K) Psi / N_d``
    """
    return zero_model_state_breakdown(n_params, n_gpus, stage, optimizer_bytes_per_param).total


def zero_max_params(
    memory_bytes_per_gpu: float, n_gpus: int, stage: int, optimizer_bytes_per_param: float = 12
) -> float:
    """The largest parameter count whose model states fit in ``memory_bytes_per_gpu`` under ZeRO ``stage``.

    The inverse of :func:`zero_model_state_bytes`, which is linear in Psi:
    ``memory / bytes_per_param``, with ``bytes_per_param`` = ``2 + 2 + K`` for
    stage 0, ``4 + K / N_d`` for stage 1, ``2 + (2 + K) / N_d`` for stage 2 and
    ``(4 + K) / N_d`` for stage 3. Activations and buffers are not counted (ZeRO
    section 5.4 counts the same way).
    """
    check_positive("memory_bytes_per_gpu", memory_bytes_per_gpu)
    return memory_bytes_per_gpu / zero_model_state_bytes(1.0, n_gpus, stage, optimizer_bytes_per_param)


def zero_communication_volume(n_params: float, stage: int, n_gpus: int | None = None) -> float:
    """Elements (parameters' worth, not bytes) each GPU sends per training step under ZeRO ``stage``.

    ZeRO paper, section 7: plain data parallelism all-reduces the gradients as
    a reduce-scatter plus an all-gather, ``Psi`` elements each, ``2 Psi`` in all;
    stages 1 and 2 reduce-scatter the gradients and all-gather the updated
    parameters, the same ``2 Psi``; stage 3 all-gathers the parameters once
    in forward and once more in backward, and reduce-scatters the gradients:
    ``3 Psi``, 1.5x data parallelism. These are the paper's large-``N_d``
    figures. Given ``n_gpus``, the exact ring volume is returned instead: each
    collective moves ``(N_d - 1) / N_d`` of its data per GPU, so
    ``2 (N_d - 1) / N_d Psi`` or ``3 (N_d - 1) / N_d Psi``, and 0 on one GPU.
    Multiply by the bytes per element (2 for fp16) for bytes.
    """
    check_positive("n_params", n_params)
    _check_stage(stage)
    collectives = 3 if stage == 3 else 2
    volume = collectives * float(n_params)
    if n_gpus is not None:
        check_positive_int("n_gpus", n_gpus)
        volume *= (n_gpus - 1) / n_gpus
    return volume


RECOMPUTE_KINDS = ("none", "selective", "full")

_KORTHIKANTI = ("Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer Models', "
                "arXiv:2205.05198, Table 2")


def activation_bytes_per_layer(seq_len: int, micro_batch: int, hidden: int, n_heads: int, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Bytes of activations one transformer layer stores for backward on one GPU, in 16-bit training.

    Korthikanti et al. 2022 (arXiv:2205.05198), section 4 and Table 2, with
    s = ``seq_len``, b = ``micro_batch``, h = ``hidden``, a = ``n_heads`` and
    t = ``tp`` (the tensor-parallel size):

    ============================================  ==========================
    no parallelism (t = 1)                        ``sbh (34 + 5as/h)``
    tensor parallel                               ``sbh (10 + 24/t + 5as/(ht))``
    tensor + sequence parallel                    ``sbh (34/t + 5as/(ht))``
    tensor parallel + selective recompute         ``sbh (10 + 24/t)``
    tensor + sequence parallel + selective        ``sbh (34/t)``
    full recompute                                ``sbh 2``
    ============================================  ==========================

    The ``5as/h`` term is the softmax output (``2as^2b`` bytes), its dropout
    mask (``as^2b``) and the dropout's output, which the product with V keeps
    (``2as^2b``): ``5as^2b`` bytes in all (section 4.1); selective
    recomputation drops exactly it (section 5). The ``10`` of the
    tensor-parallel rows is what plain tensor parallelism replicates on every
    GPU (section 4.2.1): the inputs of the two LayerNorms (``4sbh``), the
    inputs of the QKV projection and of the first MLP linear layer (``4sbh``)
    and the two dropout masks after attention and after the MLP (``2sbh``);
    sequence parallelism splits all of it along the sequence (section 4.2.2).
    Full recomputation keeps only each layer's 16-bit input, ``2sbh`` bytes
    (Table 2; section 5 notes it could be split over the t GPUs at the cost
    of an extra all-gather, and does not count that); with sequence
    parallelism the layer's input already is split along the sequence
    (``s/t`` rows on each GPU), so we return ``2sbh/t`` there. Dropout masks
    are one byte per element, as in the paper; `utils.parallel.model.activations`
    lists the tensors one by one.
    """
    s = check_positive_int("seq_len", seq_len)
    b = check_positive_int("micro_batch", micro_batch)
    h = check_positive_int("hidden", hidden)
    a = check_positive_int("n_heads", n_heads)
    t = check_positive_int("tp (tensor-parallel size)", tp)
    if not isinstance(sequence_parallel, bool):
        raise ValueError(f"sequence_parallel must be True or False, got {sequence_parallel!r}")
    if recompute not in RECOMPUTE_KINDS:
        raise ValueError(f"recompute must be one of {RECOMPUTE_KINDS}, got {recompute!r}")
    if h % a:
        raise ValueError(f"hidden ({h}) must be a multiple of n_heads ({a})")
    sbh = float(s) * b * h
    if recompute == "full":
        return 2 * sbh / (t if sequence_parallel else 1)
    replicated = 34 / t if sequence_parallel else 10 + 24 / t
    attention = 0.0 if recompute == "selective" else 5 * a * s / (h * t)
    return sbh * (replicated + attention)


def tensor_parallel_allreduce_bytes_per_layer(seq_len: int, micro_batch: int, hidden: int,
                                              element_size: int = 2) -> float:
    """Bytes of one of the all-reduces tensor parallelism does per transformer layer: ``s b h`` elements.

    Megatron-LM (Shoeybi et al. 2019, arXiv:1909.08053, section 3 and Figure 4):
    each layer all-reduces its ``s x b x h`` output twice in forward (after
    attention and after the MLP, the ``g`` operator) and twice in backward
    (the ``f`` operator), four all-reduces of this size per layer per
    micro-batch. Sequence parallelism (Korthikanti et al. 2022, section 4.2.2)
    replaces each by a reduce-scatter plus an all-gather of the same total
    volume, but it is not free: Megatron-LM stores only each GPU's ``s/t``
    shard of a column-parallel layer's input and all-gathers it again in
    backward for the weight gradient (``megatron/core/tensor_parallel/layers.py``,
    ``LinearWithGradAccumulationAndAsyncCommunication.backward``), two more
    all-gathers of this size per layer, 25 % more bytes in all (overlapped
    there with the input-gradient GEMM). A ring all-reduce over ``t`` GPUs
    sends ``2 (t - 1) / t`` times this many bytes from each GPU.
    """
    s = check_positive_int("seq_len", seq_len)
    b = check_positive_int("micro_batch", micro_batch)
    h = check_positive_int("hidden", hidden)
    return float(s) * b * h * check_element_size(element_size)
