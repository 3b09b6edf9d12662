"""The roofline time of one engine step, and what it makes of TTFT, TPOT, throughput and concurrency.

A serving engine runs the model in *steps*. One step carries some prefill
chunks (``n`` new prompt tokens of a sequence that already has ``c`` tokens
cached) and some decode sequences (one new token each, over a cache of ``S``
tokens). With ``N`` the parameters a token's matmuls go through (every weight
matrix; the input embedding is a lookup), ``T`` the new tokens of the step and
``b`` bytes per element, a step has two parts, each on its own roofline:

- **the weight matmuls**: ``2 N T`` FLOPs (Kaplan et al., arXiv:2001.08361,
  Table 1) over the weights' ``N b`` bytes, read **once per step** however many
  tokens share it;
- **attention over the caches**: ``f`` FLOPs per (query token, attended token)
  pair and ``k`` bytes of cache per attended token, read once per sequence per
  step. For MHA/GQA ``f = 4 L H d`` and ``k = 2 L H_kv d b``; for MLA decoded
  in DeepSeek's absorbed form, every head attends over the shared latent,
  ``f = 2 L H (2 d_c + d_R)`` and ``k = L (d_c + d_R) b``
  (:func:`attention_flops_per_pair`; :mod:`utils.attention.mla`).

The step takes ``max(F_w/P, B_w/W) + max(F_a/P, B_a/W)`` (peak ``P`` FLOP/s,
bandwidth ``W``): the two parts run as different kernels, one after the other.
This is the "general" step time of Austin et al., *How to Scale Your Model*,
chapter 7 ("Theoretical estimates for LLM latency and throughput"), which
:func:`step_seconds` reproduces, and is never below the single
``max(F/P, B/W)`` over the whole step that :mod:`utils.attention.decode_cost`
uses (``overlap=True`` here). Activations, kernel launches, sampling and
communication are left out: a real engine lands above these times.

From step times follow the request-level metrics (DistServe, arXiv:2401.09670,
section 1): TTFT, the duration of the prefill; TPOT, the mean time of each
later token; end-to-end latency ``TTFT + TPOT (O - 1)`` for ``O`` output tokens.
Throughput is tokens (or requests) per second, and Little's law (Little 1961)
ties them together: ``concurrency = throughput x latency``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from utils.attention.decode_cost import FFN_AND_VOCAB, param_count, params_read_per_step
from utils.attention.kv_cache import MODELS, AttentionConfig
from utils.gpu import hardware
from utils.gpu.roofline import OpCost
from utils.published import Published
from utils.validate import check_nonnegative, check_nonnegative_int, check_positive, check_positive_int


class Roof(NamedTuple):
    """The two peaks a step is held against: ``peak_flops`` (FLOP/s) and ``bandwidth`` (HBM bytes/s)."""

    peak_flops: float
    bandwidth: float

    @classmethod
    def of(cls, gpu: str = "H100-SXM", precision: str = "bf16", n_chips: int = 1) -> "Roof":
        """The datasheet roof of ``n_chips`` of ``gpu`` (:data:`utils.gpu.hardware.GPUS`) in ``precision``."""
        check_positive_int("n_chips", n_chips)
        g = hardware.spec(gpu)
        return cls(n_chips * g.flops(precision), n_chips * g.hbm_bandwidth)

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the roof turns: ``peak_flops / bandwidth``."""
        return self.peak_flops / self.bandwidth


def attention_flops_per_pair(config: AttentionConfig, absorbed: bool = True) -> int:
    """Attention FLOPs of one query token against one attended token, all layers.

    MHA/GQA/MQA: ``4 L H d`` (``q.k`` and ``p v``, 2 FLOPs per multiply-add).
    MLA, absorbed (decode, :mod:`utils.attention.mla`): each of the ``H`` heads
    scores its ``d_c + d_R`` query against the latent and the shared RoPE key,
    then sums ``d_c``-wide latents: ``2 L H (2 d_c + d_R)``. MLA with keys and
    values rebuilt per head (``absorbed=False``, how prefill runs it): ``2 L H
    (2 d_h + d_R)``.
    """
    if config.kind != "MLA":
        return 4 * config.n_layers * config.n_heads * config.head_dim
    width = 2 * config.kv_lora_rank if absorbed else 2 * config.head_dim
    return 2 * config.n_layers * config.n_heads * (width + config.rope_head_dim)


@dataclass(frozen=True)
class ServedModel:
    """What a step needs to know of a model, in FLOPs and bytes.

    ``n_params``: ``N``, the parameters a token's matmuls go through (``2N``
    FLOPs per token); ``weight_bytes``: what a step reads of them (``N b``);
    ``resident_bytes``: all weights in memory (the embedding table too);
    ``kv_bytes_per_token``: cache bytes per cached token, all layers;
    ``attn_flops_decode`` and ``attn_flops_prefill``: FLOPs per (query,
    attended) token pair (:func:`attention_flops_per_pair`).
    """

    name: str
    n_params: float
    weight_bytes: float
    resident_bytes: float
    kv_bytes_per_token: float
    attn_flops_decode: float
    attn_flops_prefill: float

    def __post_init__(self) -> None:
        for field in ("n_params", "weight_bytes", "resident_bytes", "kv_bytes_per_token"):
            check_positive(field, getattr(self, field), finite=True)
        for field in ("attn_flops_decode", "attn_flops_prefill"):
            check_nonnegative(field, getattr(self, field), finite=True)


def served_model(name: str, weight_bytes_per_param: float = 2, kv_bytes_per_elem: int = 2) -> ServedModel:
    """A LLaMA-style model of :data:`utils.attention.decode_cost.FFN_AND_VOCAB` (LLaMA-2, Llama 3, Mistral).

    Parameter counts from :func:`~utils.attention.decode_cost.params_read_per_step`
    and :func:`~utils.attention.decode_cost.param_count`, the cache from
    :meth:`~utils.attention.kv_cache.AttentionConfig.cache_bytes` (a sliding
    window is ignored here: every cached token is read).
    """
    if name not in FFN_AND_VOCAB:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(FFN_AND_VOCAB)}")
    check_positive("weight_bytes_per_param", weight_bytes_per_param, finite=True)
    config = MODELS[name]
    n = params_read_per_step(name)
    flops = attention_flops_per_pair(config)
    return ServedModel(name, n, n * weight_bytes_per_param, param_count(name) * weight_bytes_per_param,
                       config.cache_bytes(bytes_per_elem=kv_bytes_per_elem, use_window=False), flops, flops)


@dataclass(frozen=True)
class StepCost:
    """FLOPs and bytes of one step's two parts: the weight matmuls and attention over the caches."""

    linear: OpCost
    attention: OpCost
    tokens: int

    @property
    def total(self) -> OpCost:
        return OpCost(self.linear.flops + self.attention.flops, self.linear.nbytes + self.attention.nbytes)

    @property
    def flops(self) -> float:
        return self.total.flops

    @property
    def nbytes(self) -> float:
        return self.total.nbytes


def step_cost(model: ServedModel, decode_contexts: Sequence[int] = (),
              prefill_chunks: Sequence[tuple[int, int]] = ()) -> StepCost:
    """FLOPs and HBM bytes of one step.

    ``decode_contexts``: one entry per decoding sequence, the ``S`` tokens its
    new token attends to (pairs ``S``, cache bytes ``S k``). ``prefill_chunks``:
    ``(n, c)`` per prefilling sequence, ``n`` new tokens after ``c`` cached ones;
    causal attention gives ``n c + n (n + 1) / 2`` pairs, and the step reads the
    ``c`` cached tokens and writes the ``n`` new ones (``(c + n) k`` bytes).
    Linear part: ``2 N T`` FLOPs and ``weight_bytes``, ``T`` = all new tokens.
    """
    decode_contexts = [s if type(s) is int and s >= 0 else check_nonnegative_int("a decode context", s)
                       for s in decode_contexts]  # plain ints skip the general check (the simulator's every step)
    chunks = []
    for chunk in prefill_chunks:
        if not isinstance(chunk, tuple) or len(chunk) != 2:
            raise ValueError(f"a prefill chunk must be a pair (new_tokens, cached_tokens), got {chunk!r}")
        chunks.append((check_positive_int("a chunk's new_tokens", chunk[0]),
                       check_nonnegative_int("a chunk's cached_tokens", chunk[1])))
    tokens = len(decode_contexts) + sum(n for n, _ in chunks)
    if tokens == 0:
        raise ValueError("a step needs at least one decode sequence or one prefill chunk")
    decode_pairs = sum(decode_contexts)
    prefill_pairs = sum(n * c + n * (n + 1) // 2 for n, c in chunks)
    attn_flops = model.attn_flops_decode * decode_pairs + model.attn_flops_prefill * prefill_pairs
    attn_bytes = model.kv_bytes_per_token * (decode_pairs + sum(n + c for n, c in chunks))
    linear = OpCost(2.0 * model.n_params * tokens, float(model.weight_bytes))
    return StepCost(linear, OpCost(float(attn_flops), float(attn_bytes)), tokens)


def _roofline(cost: OpCost, roof: Roof) -> float:
    return max(cost.flops / roof.peak_flops, cost.nbytes / roof.bandwidth)


def step_seconds(cost: StepCost, roof: Roof, overlap: bool = False) -> float:
    """The step's roofline time: ``max(F_w/P, B_w/W) + max(F_a/P, B_a/W)``.

    ``overlap=True`` gives ``max(F/P, B/W)`` over the whole step instead (the
    bound of :mod:`utils.attention.decode_cost`, as if the parts overlapped
    perfectly); it is never larger.
    """
    if overlap:
        return _roofline(cost.total, roof)
    return _roofline(cost.linear, roof) + _roofline(cost.attention, roof)


def decode_step_seconds(model: ServedModel, batch: int, context: int, roof: Roof) -> float:
    """One decode step of ``batch`` sequences, each attending to ``context`` tokens: the TPOT of that batch."""
    check_positive_int("batch", batch)
    return step_seconds(step_cost(model, [check_nonnegative_int("context", context)] * batch), roof)


def prefill_seconds(model: ServedModel, prompt_len: int, roof: Roof, batch: int = 1) -> float:
    """One step prefilling ``batch`` prompts of ``prompt_len`` tokens: the least TTFT (no queue, no decode)."""
    check_positive_int("batch", batch)
    return step_seconds(step_cost(model, prefill_chunks=[(check_positive_int("prompt_len", prompt_len), 0)] * batch),
                        roof)


def max_batch(model: ServedModel, context: int, hbm_bytes: float) -> int:
    """Sequences of ``context`` tokens whose caches fit beside the weights: ``floor((HBM - weights) / cache)``.

    The paged ideal, as :func:`utils.attention.decode_cost.max_batch` (activations and the framework left out).
    """
    check_positive_int("context", context)
    free = check_positive("hbm_bytes", hbm_bytes, finite=True) - model.resident_bytes
    if free <= 0:
        raise ValueError(f"the weights ({model.resident_bytes / 1e9:.1f} GB) do not fit in {hbm_bytes / 1e9:.1f} GB")
    return int(free // (model.kv_bytes_per_token * context))


class Generation(NamedTuple):
    """A static batch of ``batch`` requests, all prefilled in one step, then decoded to ``output_len`` tokens."""

    batch: int
    ttft: float
    tpot: float
    e2e: float
    tokens_per_s: float
    decode_tokens_per_s: float


def serve_batch(model: ServedModel, roof: Roof, batch: int, prompt_len: int, output_len: int) -> Generation:
    """TTFT, TPOT, end-to-end latency and throughput of a batch served together, on the roofline.

    TTFT = one prefill step of the ``batch`` prompts (which yields the first
    token); then ``output_len - 1`` decode steps, the ``j``-th attending to
    ``prompt_len + j`` tokens. TPOT is their mean (vLLM's ``(latency - ttft) /
    (output_len - 1)``), e2e ``= TTFT + TPOT (O - 1)`` (DistServe, footnote 1),
    ``tokens_per_s = batch O / e2e`` and ``decode_tokens_per_s = batch / TPOT``.
    """
    check_positive_int("output_len", output_len)
    ttft = prefill_seconds(model, prompt_len, roof, batch)
    steps = [decode_step_seconds(model, batch, prompt_len + j, roof) for j in range(1, output_len)]
    tpot = sum(steps) / len(steps) if steps else 0.0
    e2e = ttft + sum(steps)
    return Generation(batch, ttft, tpot, e2e, batch * output_len / e2e, batch / tpot if steps else math.inf)


def pareto(model: ServedModel, roof: Roof, context: int, batches: Sequence[int]) -> list[tuple[int, float, float]]:
    """``(batch, TPOT seconds, decode tokens/s)`` for each batch: the latency-throughput curve of decode.

    Growing the batch raises throughput ``B / t(B)`` and the time per token
    ``t(B)`` together; no point is better in both, so the curve is a Pareto
    frontier (*How to Scale Your Model*, chapter 7).
    """
    out = []
    for b in batches:
        t = decode_step_seconds(model, b, context, roof)
        out.append((b, t, b / t))
    return out


def max_batch_at_tpot(model: ServedModel, roof: Roof, context: int, tpot_target: float,
                      hbm_bytes: float | None = None) -> int:
    """The largest batch whose decode step takes at most ``tpot_target`` seconds (0 if even batch 1 is slower).

    The step time grows with the batch, so this bisects; ``hbm_bytes`` also caps
    the batch by memory (:func:`max_batch`).
    """
    check_positive("tpot_target", tpot_target, finite=True)
    hi = max_batch(model, max(context, 1), hbm_bytes) if hbm_bytes is not None else 1 << 20
    if hi == 0 or decode_step_seconds(model, 1, context, roof) > tpot_target:
        return 0
    lo = 1
    while lo < hi:  # invariant: lo meets the target
        mid = (lo + hi + 1) // 2
        if decode_step_seconds(model, mid, context, roof) <= tpot_target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def littles_law(throughput: float, latency: float) -> float:
    """Little's law, ``L = lambda W``: items in the system = arrival (= completion) rate x time each spends there.

    Little, "A Proof for the Queuing Formula: L = lambda W", Operations Research
    9(3), 1961. Holds for any stable system in steady state, whatever the
    order of service: requests in flight = requests/s x seconds per request,
    and sequences decoding = tokens/s x seconds per token.
    """
    return check_nonnegative("throughput", throughput, finite=True) * check_nonnegative("latency", latency,
                                                                                        finite=True)


def colocated_request_rate(batch: int, step_seconds: float, prefill_seconds: float, output_tokens: int) -> float:
    """Requests per second one GPU sustains at ``batch`` when it also runs every request's prefill.

    Each request needs one prefill of ``prefill_seconds`` and ``output_tokens - 1``
    decode steps, which it shares with the ``batch`` sequences of each step of
    ``step_seconds``. At ``r`` requests per second the GPU spends ``r P`` of each
    second prefilling and decodes in the rest, ``(1 - r P) / t`` steps of ``batch``
    tokens, which must carry the ``r (O - 1)`` decode tokens asked for:
    ``r = B / (t (O - 1) + B P)``. The prefill term is what Little's law with the
    decode step alone (``B / W``) leaves out; it is why colocated servers fall short
    of the decode bound, and why disaggregation moves prefill to other GPUs.
    """
    check_positive_int("batch", batch)
    check_positive("step_seconds", step_seconds, finite=True)
    check_nonnegative("prefill_seconds", prefill_seconds, finite=True)
    check_positive_int("output_tokens", output_tokens)
    return batch / (step_seconds * (output_tokens - 1) + batch * prefill_seconds)


SCALING_BOOK = ("Austin et al., 'How to Scale Your Model' (2025), chapter 7, 'All About Transformer Inference', "
                "section 'Modeling throughput and latency for LLaMA 2-13B'")
SCALING_BOOK_SETUP = {"chips": 8, "bandwidth_per_chip": 8.2e11, "flops_per_chip": 1.97e14, "weight_bytes": 26e9,
                      "n_params": 13e9, "context": 8192, "kv_bytes_per_sequence": {"MHA": 6.7e9, "GQA": 1.34e9}}
"""The setup of the scaling book's two LLaMA 2-13B tables: 8 TPU v5e in bf16, 8,192-token caches of 6.7 GB
(40 KV heads) or 1.34 GB (8 KV heads, "1:5 GMQA"), 26 GB of weights. The text gives 0.82 TiB/s per chip;
its step times come out of ``(B x KV + weights) / (8 x 8.2e11 B/s)`` (decimal units), as used here."""

SCALING_BOOK_LLAMA2_13B: dict[str, dict[int, Published]] = {
    kind: {b: Published(ms, "ms per decode step", f"{SCALING_BOOK}, {table}, 'Theoretical Step Time' row", "derived")
           for b, ms in zip((1, 8, 16, 32, 64, 240), row)}
    for kind, table, row in (
        ("MHA", "first table", (4.98, 12.13, 20.30, 36.65, 69.33, 249.09)),
        ("GQA", "second table (KV cache 5x smaller)", (4.17, 5.60, 7.23, 10.50, 17.04, 52.99)))}
"""The scaling book's theoretical decode step times of LLaMA 2-13B by batch size, as printed."""
