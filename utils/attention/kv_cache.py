"""KV-cache bytes of real models: multi-head, grouped-query, multi-query and multi-head latent attention.

During decoding every layer keeps the keys and values of every past token, so
the cache grows by a fixed number of bytes per token:

- MHA, GQA and MQA cache a key and a value per KV head:
  ``2 x layers x n_kv_heads x head_dim x bytes`` (:func:`kv_cache_bytes`);
  MHA has ``n_kv_heads = n_heads``, MQA one KV head (Shazeer 2019,
  arXiv:1911.02150), GQA a group size in between (Ainslie et al. 2023,
  arXiv:2305.13245).
- MLA caches one compressed latent ``c_KV`` of ``kv_lora_rank`` elements plus
  one shared RoPE key of ``rope_head_dim`` elements per layer
  (:func:`mla_kv_cache_bytes`; DeepSeek-AI, "DeepSeek-V2", arXiv:2405.04434,
  section 2.1 and Table 1: ``(d_c + d_h^R) l`` elements per token).
- Sliding-window attention (Mistral 7B, Jiang et al. 2023, arXiv:2310.06825,
  section 2) attends to the last ``W`` tokens only, so a rolling buffer of
  ``W`` slots (token ``i`` in slot ``i mod W``) holds the whole cache: the
  cached length is ``min(s, W)`` (``window`` in :func:`kv_cache_bytes`; the
  paper: 8x less at 32k tokens with ``W = 4096``).

:data:`MODELS` holds the configurations of the models the chapters compare,
each with the file it was read from.
"""

from __future__ import annotations

from dataclasses import dataclass

from utils.validate import check_positive_int

BYTES_PER_ELEM = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
"""Bytes per cached element for the dtypes the calculators offer."""


def _check_bytes_per_elem(bytes_per_elem: object) -> int:
    if bytes_per_elem not in (1, 2, 4) or isinstance(bytes_per_elem, bool):
        raise ValueError(f"bytes_per_elem must be 1 (fp8), 2 (fp16/bf16) or 4 (fp32), got {bytes_per_elem!r}")
    return int(bytes_per_elem)


def cached_tokens(seq_len: int, window: int | None = None) -> int:
    """Tokens a sequence of ``seq_len`` keeps in its cache: ``min(seq_len, W)`` under a sliding window ``W``.

    Mistral's rolling buffer (arXiv:2310.06825, section 2) stores token ``i``
    in slot ``i mod W``, overwriting what fell out of the window; ``None``
    means full attention (every token is kept).
    """
    check_positive_int("seq_len", seq_len)
    if window is None:
        return seq_len
    return min(seq_len, check_positive_int("window", window))


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int = 1, batch: int = 1,
                   bytes_per_elem: int = 2, window: int | None = None) -> int:
    """Bytes of the KV cache of ``batch`` sequences of ``seq_len`` tokens: ``2 L H_kv d s b x bytes``.

    With a sliding ``window`` ``W``, ``s`` is replaced by ``min(s, W)``
    (:func:`cached_tokens`).

    The 2 counts the key and the value; ``H_kv`` is the number of KV heads
    (all heads for MHA, 1 for MQA, the number of groups for GQA). With the
    defaults this is the cache one token adds, e.g. 512 KiB for LLaMA-2-7B in
    fp16 (32 layers x 32 heads x 128) and 320 KiB for LLaMA-2-70B (80 layers x
    8 KV heads x 128).
    """
    factors = [check_positive_int(name, value) for name, value in (
        ("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim),
        ("seq_len", cached_tokens(seq_len, window)), ("batch", batch))]
    product = 2 * _check_bytes_per_elem(bytes_per_elem)
    for factor in factors:
        product *= factor
    return product


def mla_kv_cache_bytes(n_layers: int, kv_lora_rank: int, rope_head_dim: int, seq_len: int = 1, batch: int = 1,
                       bytes_per_elem: int = 2) -> int:
    """Bytes of an MLA cache: ``(d_c + d_h^R) L s b x bytes`` (DeepSeek-V2, arXiv:2405.04434, Table 1).

    Each layer caches the compressed KV latent ``c_KV`` (``d_c`` =
    ``kv_lora_rank`` elements) and the decoupled RoPE key shared by all heads
    (``d_h^R`` = ``rope_head_dim``); the per-head keys and values are rebuilt
    from ``c_KV``, or absorbed into the query and output projections.
    """
    for name, value in (("n_layers", n_layers), ("kv_lora_rank", kv_lora_rank), ("seq_len", seq_len),
                        ("batch", batch)):
        check_positive_int(name, value)
    if not isinstance(rope_head_dim, int) or isinstance(rope_head_dim, bool) or rope_head_dim < 0:
        raise ValueError(f"rope_head_dim must be an int >= 0, got {rope_head_dim!r}")
    return (kv_lora_rank + rope_head_dim) * n_layers * seq_len * batch * _check_bytes_per_elem(bytes_per_elem)


@dataclass(frozen=True)
class AttentionConfig:
    """The attention shape of one published model, and where it was read.

    ``kv_lora_rank`` and ``rope_head_dim`` are set for MLA models only; for
    them ``n_kv_heads`` and ``head_dim`` are the heads and the per-head size
    ``d_h`` that MLA rebuilds keys and values for, so that ``kv_cache_bytes``
    gives the MHA cache the DeepSeek-V2 paper compares with (its Table 1).
    """

    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    source: str
    kv_lora_rank: int | None = None
    rope_head_dim: int | None = None
    sliding_window: int | None = None

    @property
    def kind(self) -> str:
        """``"MLA"``, ``"MHA"``, ``"MQA"`` or ``"GQA"``."""
        if self.kv_lora_rank is not None:
            return "MLA"
        if self.n_kv_heads == self.n_heads:
            return "MHA"
        return "MQA" if self.n_kv_heads == 1 else "GQA"

    def cache_bytes(self, seq_len: int = 1, batch: int = 1, bytes_per_elem: int = 2,
                    use_window: bool = True) -> int:
        """This model's KV-cache bytes, by the formula of its attention kind.

        A model with a ``sliding_window`` keeps ``min(seq_len, W)`` tokens
        unless ``use_window=False`` (an engine that ignores the window).
        """
        if self.kind == "MLA":
            return mla_kv_cache_bytes(self.n_layers, self.kv_lora_rank, self.rope_head_dim, seq_len, batch,
                                      bytes_per_elem)
        window = self.sliding_window if use_window else None
        return kv_cache_bytes(self.n_layers, self.n_kv_heads, self.head_dim, seq_len, batch, bytes_per_elem,
                              window)

    def cache_elements_per_token(self) -> int:
        """Cached numbers per token over all layers (DeepSeek-V2's Table 1 counts in these)."""
        return self.cache_bytes(bytes_per_elem=1)


def _hf(repo: str) -> str:
    return f"config.json of huggingface.co/{repo}"


MODELS: dict[str, AttentionConfig] = {c.name: c for c in (
    AttentionConfig("LLaMA-2-7B", 32, 4096, 32, 32, 128, _hf("meta-llama/Llama-2-7b-hf")),
    AttentionConfig("LLaMA-2-70B", 80, 8192, 64, 8, 128, _hf("meta-llama/Llama-2-70b-hf")),
    AttentionConfig("Llama-3-8B", 32, 4096, 32, 8, 128, _hf("meta-llama/Meta-Llama-3-8B")),
    AttentionConfig("Llama-3-70B", 80, 8192, 64, 8, 128, _hf("meta-llama/Meta-Llama-3-70B")),
    # sliding_window 4096 in the config.json, the paper's W (arXiv:2310.06825, Table 1)
    AttentionConfig("Mistral-7B", 32, 4096, 32, 8, 128, _hf("mistralai/Mistral-7B-v0.1"), sliding_window=4096),
    # DeepSeek-V2's baseline for its 93.3 % (GQA-8; also the DeepSeek LLM paper, arXiv:2401.02954, Table 2)
    AttentionConfig("DeepSeek-67B", 95, 8192, 64, 8, 128, _hf("deepseek-ai/deepseek-llm-67b-base")),
    # head_dim is the paper's d_h = 128 (qk_nope_head_dim = v_head_dim); queries and keys add 64 RoPE dims.
    # MLA caches kv_lora_rank (d_c = 4 d_h = 512) + qk_rope_head_dim (d_h^R = d_h / 2 = 64) per layer.
    AttentionConfig("DeepSeek-V2", 60, 5120, 128, 128, 128, _hf("deepseek-ai/DeepSeek-V2"),
                    kv_lora_rank=512, rope_head_dim=64),
    AttentionConfig("DeepSeek-V3", 61, 7168, 128, 128, 128, _hf("deepseek-ai/DeepSeek-V3"),
                    kv_lora_rank=512, rope_head_dim=64),
)}
"""Attention configurations of the models part 3 compares, keyed by name."""


def kv_cache_reduction(baseline: AttentionConfig, model: AttentionConfig, baseline_bits: float = 16,
                       model_bits: float = 16) -> float:
    """Fraction of ``baseline``'s per-token cache that ``model`` saves: ``1 - (e_m b_m) / (e_b b_b)``.

    ``e`` are cached elements per token (:meth:`AttentionConfig.cache_elements_per_token`)
    and ``b`` bits per element. DeepSeek-V2 against DeepSeek 67B: 34,560 against
    194,560 elements is an 82.2 % cut at equal precision; with V2's cache
    quantised to 6 bits on average against a 16-bit 67B cache (DeepSeek-V2,
    section 3.2.3) it is the paper's 93.3 %.
    """
    for name, bits in (("baseline_bits", baseline_bits), ("model_bits", model_bits)):
        if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not 0 < bits <= 32:
            raise ValueError(f"{name} must be a number of bits in (0, 32], got {bits!r}")
    return 1 - (model.cache_elements_per_token() * model_bits) / (baseline.cache_elements_per_token() * baseline_bits)
