"""What one transformer layer keeps for backward, tensor by tensor, and what a whole pipeline stage keeps.

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (MLSys 2023, arXiv:2205.05198) count the bytes a GPT-style layer
(self-attention + a 4h MLP + two LayerNorms, with dropout, 16-bit
activations, 1-byte dropout masks) stores for its backward pass:
``sbh (34 + 5as/h)`` (section 4.1, eq. 1), with s = sequence length, b =
micro-batch, h = hidden size, a = attention heads. :func:`layer_inventory`
lists those tensors one by one, with the shape each has on one GPU under
tensor parallelism (t) and sequence parallelism, so that their sum *is*
:func:`utils.parallel.memory.activation_bytes_per_layer` (Table 2), which the
tests check. The formula itself lives there, once.

:func:`first_stage_activation_bytes` is section 4.2.3 and 4.3: with the 1F1B
pipeline schedule the first of p stages holds p micro-batches of L/p layers,
L layers' worth whatever p (eq. 5), times ``1 + (p - 1)/(p m)`` with the
interleaved schedule of m model chunks per GPU, plus the embedding dropout
and, when p = 1, the output layer. Gradient accumulation changes none of it:
activations scale with the micro-batch b, not with the global batch.

Used by ``chapters/02-parallelism/08-activation-memory`` and
``labs/02-parallelism/06-activation-checkpointing``.
"""

from __future__ import annotations

from dataclasses import dataclass

from utils.parallel.memory import RECOMPUTE_KINDS, activation_bytes_per_layer
from utils.published import Published
from utils.validate import check_positive, check_positive_int

_PAPER = "Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer Models', arXiv:2205.05198"
PAPER_MODELS: dict[str, dict[str, int]] = {
    "22B": dict(n_heads=64, hidden=6144, n_layers=48, tp=8, pp=1, n_gpus=8, global_batch=4, micro_batch=4,
                n_chunks=1),
    "175B (GPT-3)": dict(n_heads=96, hidden=12288, n_layers=96, tp=8, pp=8, n_gpus=64, global_batch=64,
                         micro_batch=1, n_chunks=3),
    "530B (MT-NLG)": dict(n_heads=128, hidden=20480, n_layers=105, tp=8, pp=35, n_gpus=280, global_batch=280,
                          micro_batch=1, n_chunks=3),
    "1T": dict(n_heads=160, hidden=25600, n_layers=128, tp=8, pp=64, n_gpus=512, global_batch=512, micro_batch=1,
               n_chunks=1),
}
"""The four models of the paper's Table 3 as printed (sequence length 2048, vocabulary 51200 for all): heads,
hidden size, layers, tensor- and pipeline-parallel sizes, GPUs, global and micro-batch size. ``n_chunks`` is
section 6's schedule: the 175B and 530B models use the interleaved schedule with three model chunks per GPU,
the others plain 1F1B (1). Note the 22B model's micro-batch of 4."""
PAPER_SEQ_LEN, PAPER_VOCAB = 2048, 51200

PUBLISHED = {
    "GPT-3 5as/h": Published(80, "5as/h for a = 96, s = 2048, h = 12288", _PAPER + ", section 4.1"),
    "selective saves, GPT-3": Published(0.70, "fraction of activation memory", _PAPER + ", section 5"),
    "selective saves, MT-NLG": Published(0.65, "fraction of activation memory", _PAPER + ", section 5"),
    "selective FLOPs overhead, GPT-3": Published(0.027, "recompute FLOPs per iteration, relative to model FLOPs",
                                                 _PAPER + ", section 5 (from appendix A, eqs. 7 and 8)"),
    "selective FLOPs overhead, MT-NLG": Published(0.016, "recompute FLOPs per iteration, relative to model FLOPs",
                                                  _PAPER + ", section 5 (from appendix A, eqs. 7 and 8)"),
    "activation memory reduction": Published(5, "times (sequence parallel + selective vs tensor parallel)",
                                             _PAPER + ", abstract"),
}
"""Figures the paper states in its text; the chapter recomputes each one. The two FLOPs overheads follow from
its eq. 8, which counts the recomputation 3x too high: :mod:`utils.parallel.model.recompute_flops` has both counts."""

KINDS = ("replicated", "sharded", "attention-core")
"""How a stored tensor behaves under parallelism (Korthikanti section 4.2 and 5):
``replicated``: full size on every tensor-parallel GPU (the ``10`` of Table 2), split along the sequence by
sequence parallelism; ``sharded``: split by t by tensor parallelism (the ``24/t``); ``attention-core``: the
softmax output, its dropout mask and the dropout output, ``5as/h``, which selective recomputation drops."""


@dataclass(frozen=True)
class StoredTensor:
    """One tensor a transformer layer keeps for backward: its shape on one GPU and its bytes per element."""

    name: str
    block: str
    shape: tuple[int, ...]
    element_bytes: int
    needed_by: str
    kind: str

    @property
    def nbytes(self) -> int:
        n = self.element_bytes
        for dim in self.shape:
            n *= dim
        return n


def _check_layer(s: int, b: int, h: int, a: int, t: int, sequence_parallel: bool) -> None:
    for name, value in (("seq_len", s), ("micro_batch", b), ("hidden", h), ("n_heads", a), ("tp", t)):
        check_positive_int(name, value)
    if not isinstance(sequence_parallel, bool):
        raise ValueError(f"sequence_parallel must be True or False, got {sequence_parallel!r}")
    if h % a:
        raise ValueError(f"hidden ({h}) must be a multiple of n_heads ({a})")
    if a % t:
        raise ValueError(f"n_heads ({a}) must be a multiple of tp ({t}): tensor parallelism splits whole heads")
    if sequence_parallel and s % t:
        raise ValueError(f"seq_len ({s}) must be a multiple of tp ({t}) with sequence parallelism")


def layer_inventory(seq_len: int, micro_batch: int, hidden: int, n_heads: int, tp: int = 1,
                    sequence_parallel: bool = False, recompute: str = "none") -> list[StoredTensor]:
    """The tensors one GPT layer stores for backward on one GPU (Korthikanti et al. 2022, section 4.1, Fig. 2-3).

    Attention block, ``11sbh + 5as^2b`` bytes: the LayerNorm output that feeds
    the Q, K, V projection (2sbh), Q and K for ``QK^T`` (4sbh), the softmax
    output (2as^2b), the softmax-dropout mask (as^2b), the dropout output and
    V for the product with V (2as^2b + 2sbh), the input of the output
    projection (2sbh) and the attention-dropout mask (sbh). MLP, ``19sbh``:
    the inputs of the two linear layers (2sbh, 8sbh), the GeLU input (8sbh),
    the dropout mask (sbh). LayerNorms, ``4sbh``: each stores its input. The
    LayerNorm mean and 1/std (``sb`` elements each) are neglected, as in the
    paper. Tensor parallelism splits heads and the 4h MLP width by t;
    sequence parallelism splits the ``replicated`` tensors along s;
    ``recompute="selective"`` drops the ``attention-core`` ones;
    ``recompute="full"`` keeps only the layer's input.
    """
    s, b, h, a, t = seq_len, micro_batch, hidden, n_heads, tp
    _check_layer(s, b, h, a, t, sequence_parallel)
    if recompute not in RECOMPUTE_KINDS:
        raise ValueError(f"recompute must be one of {RECOMPUTE_KINDS}, got {recompute!r}")
    s_rep = s // t if sequence_parallel else s  # rows of a replicated tensor on one GPU
    heads, d = a // t, h // a
    if recompute == "full":
        return [StoredTensor("layer input (checkpoint)", "layer", (s_rep, b, h), 2, "the recomputed forward",
                             "replicated")]
    rep, sh, core = KINDS
    items = [
        StoredTensor("LayerNorm 1 input", "layernorm", (s_rep, b, h), 2, "LayerNorm 1 backward", rep),
        StoredTensor("QKV projection input", "attention", (s_rep, b, h), 2, "QKV weight gradient", rep),
        StoredTensor("Q", "attention", (b, heads, s, d), 2, "QK^T backward", sh),
        StoredTensor("K", "attention", (b, heads, s, d), 2, "QK^T backward", sh),
        StoredTensor("softmax output", "attention", (b, heads, s, s), 2, "softmax backward", core),
        StoredTensor("softmax dropout mask", "attention", (b, heads, s, s), 1, "dropout backward", core),
        StoredTensor("softmax dropout output", "attention", (b, heads, s, s), 2, "(attention @ V) backward", core),
        StoredTensor("V", "attention", (b, heads, s, d), 2, "(attention @ V) backward", sh),
        StoredTensor("output projection input", "attention", (s, b, heads * d), 2, "projection weight gradient",
                     sh),
        StoredTensor("attention dropout mask", "attention", (s_rep, b, h), 1, "dropout backward", rep),
        StoredTensor("LayerNorm 2 input", "layernorm", (s_rep, b, h), 2, "LayerNorm 2 backward", rep),
        StoredTensor("MLP fc1 input", "mlp", (s_rep, b, h), 2, "fc1 weight gradient", rep),
        StoredTensor("GeLU input", "mlp", (s, b, 4 * h // t), 2, "GeLU backward", sh),
        StoredTensor("MLP fc2 input (GeLU output)", "mlp", (s, b, 4 * h // t), 2, "fc2 weight gradient", sh),
        StoredTensor("MLP dropout mask", "mlp", (s_rep, b, h), 1, "dropout backward", rep),
    ]
    if recompute == "selective":
        items = [x for x in items if x.kind != core]
    return items


def inventory_bytes(items: list[StoredTensor]) -> int:
    """Total bytes of an inventory."""
    return sum(x.nbytes for x in items)


def bytes_by(items: list[StoredTensor], key: str = "kind") -> dict[str, int]:
    """Bytes of an inventory grouped by ``"kind"`` or ``"block"``, in order of first appearance."""
    if key not in ("kind", "block"):
        raise ValueError(f"key must be 'kind' or 'block', got {key!r}")
    out: dict[str, int] = {}
    for x in items:
        out[getattr(x, key)] = out.get(getattr(x, key), 0) + x.nbytes
    return out


def interleave_factor(pp: int, n_chunks: int = 1) -> float:
    """``1 + (p - 1)/(p m)``: how much more the first stage holds with m model chunks per GPU (section 4.2.3).

    ``n_chunks = 1`` means the plain (non-interleaved) 1F1B schedule, which
    holds exactly L layers' worth: the factor is then 1. The paper's formula
    is for the interleaved schedule, m >= 2.
    """
    p = check_positive_int("pp (pipeline stages)", pp)
    m = check_positive_int("n_chunks (model chunks per GPU)", n_chunks)
    return 1.0 if m == 1 else 1 + (p - 1) / (p * m)


@dataclass(frozen=True)
class StageActivations:
    """Activation bytes on the first pipeline stage's GPU, by origin; ``total`` is their sum."""

    layers: float
    embedding_dropout: float
    output_layer: float

    @property
    def total(self) -> float:
        return self.layers + self.embedding_dropout + self.output_layer


def first_stage_activation_bytes(seq_len: int, micro_batch: int, hidden: int, n_heads: int, n_layers: int,
                                 vocab: int, tp: int = 1, pp: int = 1, sequence_parallel: bool = False,
                                 recompute: str = "none", n_chunks: int = 1,
                                 n_microbatches: int | None = None) -> StageActivations:
    """Activation bytes held at peak by the GPU of the first pipeline stage (Korthikanti section 4.2.3, 4.3).

    Layers: the first stage keeps ``min(p, n_microbatches)`` micro-batches in
    flight (1F1B), each through its L/p layers, so with ``n_microbatches >= p``
    it holds L layers' worth, ``L x activation_bytes_per_layer`` (eq. 5 with
    sequence parallelism), times :func:`interleave_factor` with m > 1 chunks.
    Extra terms (section 4.3, written there for sequence parallelism): the
    embedding dropout mask, ``sbhp/t`` (one byte per element, p micro-batches);
    and only when p = 1, the final LayerNorm input and the output projection
    input (``2sbh/t`` each) and the fp32 logits of the cross-entropy
    (``4sbv/t``): together ``sbhL/t (p/L + delta_{p=1} 4/L (1 + v/h))``.
    Without sequence parallelism we do not divide the embedding dropout, the
    LayerNorm and the projection input by t (they are replicated), while the
    logits stay split over the vocabulary. Gradient accumulation only
    changes ``n_microbatches``: the micro-batch size b is what scales memory.
    """
    s, b, h, a = seq_len, micro_batch, hidden, n_heads
    L = check_positive_int("n_layers", n_layers)
    v = check_positive_int("vocab", vocab)
    p = check_positive_int("pp (pipeline stages)", pp)
    per_layer = activation_bytes_per_layer(s, b, h, a, tp=tp, sequence_parallel=sequence_parallel,
                                           recompute=recompute)
    if L % p:
        raise ValueError(f"n_layers ({L}) must be a multiple of pp ({p}): each stage holds L/p layers")
    in_flight = p if n_microbatches is None else min(p, check_positive_int("n_microbatches", n_microbatches))
    layers = per_layer * (L // p) * in_flight * interleave_factor(p, n_chunks)
    split = tp if sequence_parallel else 1
    sbh = float(s) * b * h
    embedding = sbh * in_flight / split
    output = (4 * sbh / split + 4.0 * s * b * v / tp) if p == 1 else 0.0
    return StageActivations(layers, embedding, output)


def plot_layer_breakdown(seq_len: int = 2048, micro_batch: int = 1, hidden: int = 12288, n_heads: int = 96,
                         tp: int = 8, gpu_memory_gb: float = 80.0, n_layers: int = 96):
    """Stacked bars: one layer's stored bytes by kind, for each of the six rows of Table 2 (GPT-3 by default).

    The right axis gives the same bars times ``n_layers`` (what the first pipeline stage holds), against
    ``gpu_memory_gb``.
    """
    import matplotlib.pyplot as plt

    check_positive("gpu_memory_gb", gpu_memory_gb)
    configs = (("t = 1", 1, False, "none"), (f"TP {tp}", tp, False, "none"), (f"TP {tp}\n+ SP", tp, True, "none"),
               (f"TP {tp}\n+ sel.", tp, False, "selective"), (f"TP+SP\n+ sel.", tp, True, "selective"),
               ("full\nrecompute", tp, True, "full"))
    colours = {"replicated": "tab:orange", "sharded": "tab:blue", "attention-core": "tab:red",
               "layer": "tab:gray"}
    fig, ax = plt.subplots(figsize=(7.6, 3.6))
    for i, (label, t, sp, rc) in enumerate(configs):
        inv = layer_inventory(seq_len, micro_batch, hidden, n_heads, tp=t, sequence_parallel=sp, recompute=rc)
        bottom = 0.0
        groups = bytes_by(inv, "kind") if rc != "full" else {"layer": inventory_bytes(inv)}
        for kind, nbytes in groups.items():
            ax.bar(i, nbytes / 2**20, bottom=bottom, color=colours[kind], label=kind if i in (0, 5) else None)
            bottom += nbytes / 2**20
        ax.text(i, bottom, f"{bottom:,.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(configs)), [c[0] for c in configs], fontsize=8)
    ax.set_ylabel("MiB per layer per GPU")
    top = ax.get_ylim()[1]
    ax.set_ylim(0, top * 1.1)
    twin = ax.twinx()
    twin.set_ylim(0, top * 1.1 * n_layers / 1024)
    twin.set_ylabel(f"GiB for {n_layers} layers")
    if gpu_memory_gb / 1.073741824 < top * 1.1 * n_layers / 1024:
        twin.axhline(gpu_memory_gb / 1.073741824, color="k", ls="--", lw=1)
        twin.text(5.4, gpu_memory_gb / 1.073741824, f"{gpu_memory_gb:g} GB", ha="right", va="bottom", fontsize=8)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(f"s={seq_len}, b={micro_batch}, h={hidden}, a={n_heads}: bytes one layer stores", fontsize=9)
    fig.tight_layout()
    return fig


def plot_stage_calculator(seq_len: int = 2048, micro_batch: int = 1, hidden: int = 12288, n_heads: int = 96,
                          n_layers: int = 96, vocab: int = 51200, tp: int = 8, pp: int = 8,
                          sequence_parallel: bool = True, recompute: str = "selective", n_chunks: int = 3,
                          gpu_memory_gb: float = 80.0):
    """The first pipeline stage's activation GB (layers, embedding dropout, output layer) against GPU memory.

    The defaults are GPT-3 as Korthikanti et al. train it (Table 3 and section 6: b = 1, three model chunks).
    Left: one stacked bar for the chosen configuration. Right: total against the micro-batch size, for each
    recomputation kind; gradient accumulation moves along neither axis.
    """
    import matplotlib.pyplot as plt

    kw = dict(seq_len=seq_len, hidden=hidden, n_heads=n_heads, n_layers=n_layers, vocab=vocab, tp=tp, pp=pp,
              sequence_parallel=sequence_parallel, n_chunks=n_chunks)
    got = first_stage_activation_bytes(micro_batch=micro_batch, recompute=recompute, **kw)
    fig, (left, right) = plt.subplots(1, 2, figsize=(8.4, 3.4), gridspec_kw={"width_ratios": [0.6, 1]})
    bottom = 0.0
    for name, value, colour in (("layers", got.layers, "tab:blue"), ("embedding dropout", got.embedding_dropout,
                                "tab:green"), ("output layer", got.output_layer, "tab:purple")):
        left.bar(0, value / 1e9, bottom=bottom, color=colour, label=name)
        bottom += value / 1e9
    left.axhline(gpu_memory_gb, color="k", ls="--", lw=1)
    left.set_xticks([0], [f"{recompute}\nb = {micro_batch}"])
    left.set_ylabel("GB on the first stage's GPU")
    left.set_title(f"{bottom:,.1f} GB of activations", fontsize=9)
    left.legend(fontsize=7)
    sizes = [1, 2, 4, 8, 16]
    for rc, colour in zip(RECOMPUTE_KINDS, ("tab:red", "tab:blue", "tab:gray")):
        right.plot(sizes, [first_stage_activation_bytes(micro_batch=mb, recompute=rc, **kw).total / 1e9
                           for mb in sizes], "o-", color=colour, label=rc)
    right.axhline(gpu_memory_gb, color="k", ls="--", lw=1, label=f"{gpu_memory_gb:g} GB GPU")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("micro-batch size b (sequences)")
    right.set_title(f"t={tp}, p={pp}, SP={sequence_parallel}, L={n_layers}", fontsize=9)
    right.legend(fontsize=7)
    fig.tight_layout()
    return fig
