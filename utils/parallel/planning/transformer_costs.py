"""Size and FLOPs of a decoder-only transformer: parameters per layer, forward and training FLOPs.

FLOPs count the matrix multiplications only, as Narayanan et al., "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
arXiv:2104.04473, appendix: an ``m x k`` by ``k x n`` product is ``2 m k n``
FLOPs; one layer's forward over ``b`` sequences of ``s`` tokens is
``2 b s W + 4 b s^2 h`` (``W`` its weights; ``4 b s^2 h`` the attention
scores and the weighted sum of values, causal mask not discounted); the logit
layer is ``2 b s h V``; backward is twice forward. For a GPT layer (4h GELU
MLP, as many kv heads as heads) with full recomputation this is their eq. (3),
``96 B s l h^2 (1 + s/6h + V/16lh)``. The model generalises it to grouped-query
attention (``kv_heads``) and gated FFNs (SwiGLU: three matrices).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from utils.gpu.tensor_cores import n_tiles, tile_quantization_efficiency, wave_quantization_efficiency
from utils.parallel.model.head_sharding import kv_head_sharding
from utils.parallel.memory import RECOMPUTE_KINDS
from utils.validate import check_positive_int

GEMM_TILES = ((128, 256), (256, 128), (128, 128), (64, 128), (128, 64))
"""Output tile shapes a cuBLAS-like library chooses among (each GEMM gets its best, as a heuristic would)."""


def check_recompute(recompute: str) -> None:
    """``ValueError`` unless ``recompute`` is one of :data:`utils.parallel.memory.RECOMPUTE_KINDS`."""
    if recompute not in RECOMPUTE_KINDS:
        raise ValueError(f"recompute must be one of {RECOMPUTE_KINDS}, got {recompute!r}")


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer. ``ffn`` defaults to ``4 hidden``, ``kv_heads`` to ``heads``.

    ``gated_ffn``: three FFN matrices (SwiGLU, Llama) instead of two (GELU, GPT).
    ``tied_embeddings``: the output layer reuses the input embedding (GPT, Megatron).
    """

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq_len: int
    ffn: int | None = None
    kv_heads: int | None = None
    gated_ffn: bool = False
    tied_embeddings: bool = True
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for attr in ("layers", "hidden", "heads", "vocab", "seq_len"):
            check_positive_int(attr, getattr(self, attr))
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.ffn is not None:
            check_positive_int("ffn", self.ffn)
        if self.kv_heads is not None and (check_positive_int("kv_heads", self.kv_heads) > self.heads
                                          or self.heads % self.kv_heads):
            raise ValueError(f"kv_heads must divide heads ({self.heads}), got {self.kv_heads}")

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): ``kv_heads x head_dim``."""
        return (self.kv_heads or self.heads) * (self.hidden // self.heads)

    def kv_width_per_rank(self, tp: int) -> int:
        """Width of K (and of V) on one of ``tp`` ranks: ``kv_dim / tp``, or one whole head if ``tp > kv_heads``.

        Megatron-core splits the KV heads (query groups) over TP with
        ``divide(num_query_groups, tp)``, so ``tp`` must divide ``kv_heads``;
        past that, each rank needs a whole KV head, replicated ``tp / kv_heads``
        times (what inference engines do): :func:`utils.parallel.model.head_sharding.kv_head_sharding`.
        ``ValueError`` if neither divides the other.
        """
        sharding = kv_head_sharding(self.heads, self.kv_heads or self.heads, check_positive_int("tp", tp),
                                    replicate_kv=True)
        return sharding.kv_heads_per_rank * (self.hidden // self.heads)

    def gemm_shapes(self, tokens: int, tp: int = 1) -> list[tuple[int, int, int]]:
        """``(M, N, K)`` of one layer's forward GEMMs on one of ``tp`` ranks, for ``tokens`` rows.

        QKV ``(T, (h + 2 kv)/t, h)``, attention output ``(T, h, h/t)``, FFN in
        ``(T, (1 or 2) ffn/t, h)``, FFN out ``(T, h, ffn/t)`` (Megatron's column-
        then row-parallel split). The attention scores, per head, do not depend on t and are left out.
        """
        T, t, h = check_positive_int("tokens", tokens), check_positive_int("tp", tp), self.hidden
        return [(T, h // t + 2 * self.kv_width_per_rank(t), h), (T, h, h // t),
                (T, (2 if self.gated_ffn else 1) * self.ffn_size // t, h), (T, h, self.ffn_size // t)]

    def gemm_quantization_efficiency(self, tokens: int, tp: int, n_sms: int) -> float:
        """FLOP-weighted tile x wave quantization efficiency of one layer's GEMMs on one rank.

        NVIDIA, "Matrix Multiplication Background User's Guide", chapter 3
        (:mod:`utils.gpu.tensor_cores`): an ``M x N`` output cut into tiles
        wastes the part of its edge tiles outside the matrix, and the last of
        its waves of ``n_sms`` tiles may be part empty. Each GEMM of
        :meth:`gemm_shapes`, and its two backward GEMMs (outputs ``M x K`` and
        ``K x N``), takes the best of :data:`GEMM_TILES`. Tensor parallelism
        shrinks N or K by t, so this falls as t grows; it is 1 for tiles that fill whole waves.
        """
        check_positive_int("n_sms", n_sms)
        num = den = 0.0
        for m, n, k in self.gemm_shapes(tokens, tp):
            for rows, cols in ((m, n), (m, k), (k, n)):
                eff = max(tile_quantization_efficiency(rows, cols, tm, tn)
                          * wave_quantization_efficiency(n_tiles(rows, cols, tm, tn), n_sms) for tm, tn in GEMM_TILES)
                num += m * n * k * eff
                den += m * n * k
        return num / den

    @property
    def params_per_layer(self) -> int:
        """Weights of one layer: Q and output ``2h^2``, K and V ``2 h kv_dim``, FFN ``(2 or 3) h ffn``."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_dim + (3 if self.gated_ffn else 2) * h * self.ffn_size

    @property
    def embedding_params(self) -> int:
        """Input embedding, plus the output layer unless tied: ``V h`` or ``2 V h``."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def n_params(self) -> int:
        """Weights only (biases, LayerNorms, position embeddings left out: under 0.5% for the models of this book)."""
        return self.layers * self.params_per_layer + self.embedding_params

    def forward_flops_per_layer(self, sequences: float) -> float:
        """Matmul FLOPs of one layer's forward over ``sequences`` sequences: ``2 b s W + 4 b s^2 h``."""
        bs = float(sequences) * self.seq_len
        return 2 * bs * self.params_per_layer + 4 * bs * self.seq_len * self.hidden

    def logit_forward_flops(self, sequences: float) -> float:
        """The output layer's forward: ``2 b s h V``."""
        return 2.0 * sequences * self.seq_len * self.hidden * self.vocab

    def model_flops(self, sequences: float) -> float:
        """Training FLOPs without recomputation: 3 x forward (Narayanan et al. 2021, appendix)."""
        return 3 * (self.layers * self.forward_flops_per_layer(sequences) + self.logit_forward_flops(sequences))

    def hardware_flops(self, sequences: float, recompute: str) -> float:
        """Training FLOPs including recomputation: + a layer forward (full) or + the ``4 b s^2 h`` (selective).

        With ``recompute="full"`` on a GPT this is eq. (3) of Narayanan et al.:
        ``96 B s l h^2 (1 + s/6h + V/16lh)``.
        """
        check_recompute(recompute)
        extra = 0.0
        if recompute == "full":
            extra = self.layers * self.forward_flops_per_layer(sequences)
        elif recompute == "selective":
            extra = self.layers * 4.0 * sequences * self.seq_len ** 2 * self.hidden
        return self.model_flops(sequences) + extra
