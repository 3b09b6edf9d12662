"""FLOPs of one training iteration with and without activation recomputation (Korthikanti et al., appendix A).

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (arXiv:2205.05198), appendix A, count only the matrix products of a
GPT model of L layers, hidden size h, sequence s, vocabulary V and batch B.
One layer's forward costs ``24Bsh^2 + 4Bs^2h`` (Q, K, V, the output
projection and the 4h MLP; then ``QK^T`` and scores times V), backward twice
that, and the logit layer ``6BshV`` forward and backward, so

* eq. 7, model FLOPs: ``72BLsh^2 (1 + s/(6h) + V/(12hL))``;
* eq. 9, full recomputation (one more forward of every layer):
  ``96BLsh^2 (1 + s/(6h) + V/(16hL))``;
* selective recomputation reruns only the two attention products,
  ``4Bs^2h`` per layer, so the hardware FLOPs are eq. 7 plus ``4BLs^2h``.

The paper's eq. 8 writes the selective case as ``72BLsh^2 (1 + s/(3h) +
V/(12hL))``: that adds ``72BLsh^2 s/(6h) = 12BLs^2h``, the attention's
forward *and* backward, three times the ``4Bs^2h`` per layer its own text
lists. Its overheads of 2.7 % (GPT-3) and 1.6 % (MT-NLG), section 5, follow
from eq. 8; the ``4Bs^2h`` count gives a third of them. ``as_printed=True``
reproduces eq. 8; the default is the corrected count, which the activation
checkpointing lab measures by counting the matrix products PyTorch runs.
"""

from __future__ import annotations

from utils.parallel.memory import RECOMPUTE_KINDS
from utils.validate import check_positive_int


def _check(batch: int, seq_len: int, hidden: int, n_layers: int, vocab: int, recompute: str) -> None:
    for name, value in (("batch", batch), ("seq_len", seq_len), ("hidden", hidden), ("n_layers", n_layers),
                        ("vocab", vocab)):
        check_positive_int(name, value)
    if recompute not in RECOMPUTE_KINDS:
        raise ValueError(f"recompute must be one of {RECOMPUTE_KINDS}, got {recompute!r}")


def model_flops_per_iteration(batch: int, seq_len: int, hidden: int, n_layers: int, vocab: int) -> float:
    """Eq. 7 of Korthikanti et al.: ``72BLsh^2 (1 + s/(6h) + V/(12hL))``, forward and backward, no recompute."""
    _check(batch, seq_len, hidden, n_layers, vocab, "none")
    B, s, h, L, V = batch, seq_len, hidden, n_layers, vocab
    return 72.0 * B * L * s * h**2 * (1 + s / (6 * h) + V / (12 * h * L))


def hardware_flops_per_iteration(batch: int, seq_len: int, hidden: int, n_layers: int, vocab: int,
                                 recompute: str = "none", as_printed: bool = False) -> float:
    """FLOPs the GPUs run in one iteration, recomputation included (Korthikanti et al., appendix A).

    ``"none"``: eq. 7. ``"full"``: eq. 9, ``96BLsh^2 (1 + s/(6h) + V/(16hL))``.
    ``"selective"``: eq. 7 plus ``4BLs^2h`` (the recomputed ``QK^T`` and
    scores times V), or with ``as_printed=True`` the paper's eq. 8,
    ``72BLsh^2 (1 + s/(3h) + V/(12hL))``, which adds ``12BLs^2h``.
    """
    _check(batch, seq_len, hidden, n_layers, vocab, recompute)
    if not isinstance(as_printed, bool):
        raise ValueError(f"as_printed must be True or False, got {as_printed!r}")
    B, s, h, L, V = batch, seq_len, hidden, n_layers, vocab
    model = model_flops_per_iteration(B, s, h, L, V)
    if recompute == "none":
        return model
    if recompute == "full":
        return 96.0 * B * L * s * h**2 * (1 + s / (6 * h) + V / (16 * h * L))
    if as_printed:
        return 72.0 * B * L * s * h**2 * (1 + s / (3 * h) + V / (12 * h * L))
    return model + 4.0 * B * L * s**2 * h


def recompute_overhead(seq_len: int, hidden: int, n_layers: int, vocab: int, recompute: str = "selective",
                       as_printed: bool = False) -> float:
    """Recomputed FLOPs per iteration as a fraction of the model FLOPs (hardware / model - 1; B cancels).

    For selective recomputation this is ``(s/(18h)) / (1 + s/(6h) + V/(12hL))``
    (about 0.9 % for GPT-3), or with ``as_printed=True`` the paper's
    ``(s/(6h)) / (1 + s/(6h) + V/(12hL))`` (2.7 %). Full recomputation: about 1/3.
    """
    hardware = hardware_flops_per_iteration(1, seq_len, hidden, n_layers, vocab, recompute, as_printed)
    return hardware / model_flops_per_iteration(1, seq_len, hidden, n_layers, vocab) - 1
