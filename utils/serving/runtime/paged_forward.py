"""One forward pass of the tiny LLaMA over a *ragged* batch, with keys and values in a paged cache.

This is the model-runner half of a serving engine. One engine step carries a
segment of new tokens for each scheduled request: a whole or partial prompt
(prefill, possibly a chunk of one), or the single last token of a request
that is decoding. vLLM's v1 engine flattens them into one sequence of ``T``
tokens, so every weight matrix is read once per step for all requests
(Yu et al. 2022, Orca's "selective batching": the linear layers batch across
requests, attention runs per request):

- embedding, every ``Linear``, the norms and SwiGLU act on the ``(T, dim)``
  tensor at once;
- RoPE rotates each token by its own absolute position;
- each segment's new keys and values are written into its blocks
  (token at position ``p`` goes to block ``table[p // B]``, slot ``p % B``);
- each segment's queries attend to its cached prefix and to themselves,
  causally (query at position ``p`` sees keys ``0 .. p``).

The cache may be stored quantised (``KVBlocks(..., kv_format="int8" | "fp8_e4m3")``):
keys and values are quantised as they are written and dequantised as they are
read, so the cache holds 1 byte per element (plus the int8 cache's scales).

The arithmetic is :class:`utils.attention.llama.TinyLlama`'s, term for term,
so in float64 the logits equal a one-request forward to rounding, and greedy
tokens are identical.

``decode_attention`` chooses how the one-token segments (decodes) attend:
``"loop"``, one request at a time like the prefill chunks; or all of them in one
call per layer (:class:`utils.serving.runtime.batched_attention.DecodeBatch`:
``"batched"`` runs the Triton split-KV kernel on a GPU and a batched PyTorch
gather elsewhere, ``"torch"`` and ``"triton"`` force one). Prefill chunks always
take the loop. Either way, every segment's keys and values are written in one
scatter per layer before any attention (segments never share a slot they
write), and the looped segments' histories are read back in one gather.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from utils.attention.llama import TinyLlama, rms_norm
from utils.attention.rope import apply_rope, compute_dtype, rope_angles
from utils.serving.runtime.batched_attention import BACKENDS, DecodeBatch
from utils.serving.quantisation.quant import KV_FORMATS, dequantize_kv, quantize_kv
from utils.validate import check_positive, check_positive_int

__all__ = ["DECODE_ATTENTION", "KVBlocks", "Segment", "forward_segments"]

DECODE_ATTENTION = ("loop", *BACKENDS)
"""The values of ``forward_segments``'s ``decode_attention``."""


class KVBlocks:
    """Key and value storage of every layer: ``(n_layers, num_blocks, block_size, n_kv_heads, head_dim)`` each.

    ``kv_format`` stores them quantised (:func:`utils.serving.quantisation.quant.quantize_kv` on write, ``dequantize_kv`` on
    read; attention itself runs in the model's dtype):

    - ``None``: in ``dtype`` (default: the model's);
    - ``"int8"``: int8 with one fp32 scale per (token, head) vector, kept beside the data in ``k_scale`` and
      ``v_scale`` of shape ``(n_layers, num_blocks, block_size, n_kv_heads)``: ``1 + 4 / head_dim`` bytes per
      element;
    - ``"fp8_e4m3"``: ``float8_e4m3fn`` with one static scale per tensor, ``kv_scale`` (vLLM's default is 1.0):
      1 byte per element.
    """

    def __init__(self, model: TinyLlama, num_blocks: int, block_size: int,
                 dtype: torch.dtype | None = None, kv_format: str | None = None, kv_scale: float = 1.0) -> None:
        c = model.config
        self.num_blocks = check_positive_int("num_blocks", num_blocks)
        self.block_size = check_positive_int("block_size", block_size)
        if kv_format not in (None, *KV_FORMATS):
            raise ValueError(f"kv_format must be None or one of {KV_FORMATS}, got {kv_format!r}")
        if kv_format is not None and dtype is not None:
            raise ValueError("give either dtype (an unquantised cache) or kv_format (a quantised one), not both")
        self.kv_format = kv_format
        param = next(model.parameters())
        self.compute_dtype = param.dtype
        shape = (c.n_layers, num_blocks, block_size, c.n_kv_heads, c.head_dim)
        storage = {None: dtype or param.dtype, "int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}[kv_format]
        self.k = torch.zeros(shape, dtype=storage, device=param.device)
        self.v = torch.zeros_like(self.k)
        self.k_scale = self.v_scale = None
        if kv_format == "int8":
            self.k_scale = torch.ones(shape[:-1], dtype=torch.float32, device=param.device)
            self.v_scale = torch.ones_like(self.k_scale)
        elif kv_format == "fp8_e4m3":
            check_positive("kv_scale", kv_scale, finite=True)
            self.k_scale = self.v_scale = torch.tensor(float(kv_scale), device=param.device)

    @property
    def nbytes(self) -> int:
        """Bytes of the cache: data, plus the int8 cache's per-vector scales."""
        scales = self.k_scale.nbytes + self.v_scale.nbytes if self.kv_format == "int8" else 0
        return self.k.nbytes + self.v.nbytes + scales

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block costs across all layers, keys and values (what a KV memory budget is divided by)."""
        return self.nbytes // self.num_blocks

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store keys and values ``(n, n_kv_heads, head_dim)`` of ``layer`` at flat ``slots``, quantised on write."""
        k_flat, v_flat = self.k[layer].flatten(0, 1), self.v[layer].flatten(0, 1)
        if self.kv_format is None:
            k_flat[slots], v_flat[slots] = k.to(self.k.dtype), v.to(self.v.dtype)
        elif self.kv_format == "int8":
            (k_flat[slots], k_s), (v_flat[slots], v_s) = quantize_kv(k, "int8"), quantize_kv(v, "int8")
            self.k_scale[layer].flatten(0, 1)[slots], self.v_scale[layer].flatten(0, 1)[slots] = k_s, v_s
        else:
            # through a byte view: indexed writes of float8 tensors are not implemented on every device
            k_flat.view(torch.uint8)[slots] = quantize_kv(k, "fp8_e4m3", self.k_scale)[0].view(torch.uint8)
            v_flat.view(torch.uint8)[slots] = quantize_kv(v, "fp8_e4m3", self.v_scale)[0].view(torch.uint8)

    def read(self, layer: int, slots: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``layer`` at flat ``slots`` in ``dtype``, dequantised on read."""
        if self.kv_format == "fp8_e4m3":
            k, v = (x[layer].flatten(0, 1).view(torch.uint8)[slots].view(x.dtype) for x in (self.k, self.v))
        else:
            k, v = self.k[layer].flatten(0, 1)[slots], self.v[layer].flatten(0, 1)[slots]
        if self.kv_format is None:
            return k.to(dtype), v.to(dtype)
        if self.kv_format == "int8":
            k_s, v_s = self.k_scale[layer].flatten(0, 1)[slots], self.v_scale[layer].flatten(0, 1)[slots]
        else:
            k_s, v_s = self.k_scale, self.v_scale
        return dequantize_kv(k, k_s, dtype), dequantize_kv(v, v_s, dtype)

    def slots(self, table: Sequence[int], start: int, stop: int) -> torch.Tensor:
        """Flat slot indices (``block * block_size + offset``) of positions ``start .. stop - 1``."""
        positions = torch.arange(start, stop)
        blocks = torch.tensor(table, dtype=torch.long)[positions // self.block_size]
        return (blocks * self.block_size + positions % self.block_size).to(self.k.device)


@dataclass(frozen=True)
class Segment:
    """New tokens of one request in a step: ``tokens`` at positions ``start ..``, stored in ``block_table``."""

    tokens: tuple[int, ...]
    start: int
    block_table: tuple[int, ...]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Causal GQA of ``n`` queries (positions ``start ..``) over ``start + n`` keys: ``(n, n_heads, head_dim)``."""
    n, n_heads, head_dim = q.shape
    group = n_heads // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q.transpose(0, 1) @ k.permute(1, 2, 0) / math.sqrt(head_dim)  # (heads, n, start + n)
    future = torch.ones(n, k.shape[0], dtype=torch.bool, device=q.device).triu(start + 1)
    out = scores.masked_fill(future, float("-inf")).softmax(-1) @ v.transpose(0, 1)
    return out.transpose(0, 1)


@torch.no_grad()
def forward_segments(model: TinyLlama, kv: KVBlocks, segments: Sequence[Segment],
                     decode_attention: str = "loop") -> torch.Tensor:
    """Run every segment's tokens through ``model``, caching their K/V; logits of each segment's last token.

    Returns ``(len(segments), vocab)``. The blocks of ``block_table`` must cover positions
    ``0 .. start + len(tokens) - 1``, and positions ``0 .. start - 1`` must already be cached.
    ``decode_attention``: one of :data:`DECODE_ATTENTION` (module docstring).
    """
    if not segments:
        raise ValueError("forward_segments needs at least one segment")
    if decode_attention not in DECODE_ATTENTION:
        raise ValueError(f"decode_attention must be one of {DECODE_ATTENTION}, got {decode_attention!r}")
    if decode_attention != "loop" and kv.kv_format is not None:
        raise ValueError(f"batched decode attention reads the cache unquantised; a {kv.kv_format} cache needs "
                         "decode_attention='loop'")
    c, device = model.config, kv.k.device
    for s in segments:
        if not s.tokens or s.start < 0 or len(s.block_table) * kv.block_size < s.start + len(s.tokens):
            raise ValueError(f"segment at start {s.start} with {len(s.tokens)} tokens does not fit its "
                             f"{len(s.block_table)} blocks of {kv.block_size}")
    tokens = torch.tensor([t for s in segments for t in s.tokens], dtype=torch.long, device=device)
    positions = torch.tensor([p for s in segments for p in range(s.start, s.start + len(s.tokens))])
    cos, sin = rope_angles(int(positions.max()) + 1, c.head_dim, c.rope_base, device=device,
                           dtype=compute_dtype(model.embed.weight.dtype))
    cos, sin = cos[positions.to(device), None, :], sin[positions.to(device), None, :]
    bounds = torch.tensor([0] + [len(s.tokens) for s in segments]).cumsum(0).tolist()
    decodes = [] if decode_attention == "loop" else [i for i, s in enumerate(segments) if len(s.tokens) == 1]
    looped = [i for i in range(len(segments)) if len(segments[i].tokens) > 1 or not decodes]
    batch = None
    if decodes:
        batch = DecodeBatch([segments[i].block_table for i in decodes], [segments[i].start + 1 for i in decodes],
                            kv.block_size, device, decode_attention,
                            None if len(decodes) == len(segments) else [bounds[i] for i in decodes])
    # one write of every segment's new keys and values per layer, then one read of every looped segment's
    # whole history: segments never share a slot they write, and each reads only its own blocks
    write_all = torch.tensor([s.block_table[p // kv.block_size] * kv.block_size + p % kv.block_size
                              for s in segments for p in range(s.start, s.start + len(s.tokens))]).to(device)
    read_all = [kv.slots(segments[i].block_table, 0, segments[i].start + len(segments[i].tokens)) for i in looped]
    read_bounds = [0]
    for slots in read_all:
        read_bounds.append(read_bounds[-1] + len(slots))
    read_all = torch.cat(read_all) if read_all else None

    x = model.embed(tokens)
    for layer, block in enumerate(model.blocks):
        attn, h = block.attn, rms_norm(x, block.attn_norm, c.eps)
        q = apply_rope(attn.wq(h).view(-1, c.n_heads, c.head_dim), cos, sin, c.rope_layout)
        k = apply_rope(attn.wk(h).view(-1, c.n_kv_heads, c.head_dim), cos, sin, c.rope_layout)
        v = attn.wv(h).view(-1, c.n_kv_heads, c.head_dim)
        kv.write(layer, write_all, k, v)
        if batch is not None and batch.rows is None:  # all decodes: one call, no loop
            out = batch.attend(q, kv.k[layer], kv.v[layer])
        else:
            out = torch.empty_like(q)
        if looped:
            keys, values = kv.read(layer, read_all, q.dtype)
        for j, i in enumerate(looped):
            lo, hi, a, b = bounds[i], bounds[i + 1], read_bounds[j], read_bounds[j + 1]
            out[lo:hi] = _attend(q[lo:hi], keys[a:b], values[a:b], segments[i].start)
        if batch is not None and batch.rows is not None:
            out[batch.rows] = batch.attend(q[batch.rows], kv.k[layer], kv.v[layer])
        x = x + attn.wo(out.flatten(1))
        n = rms_norm(x, block.ffn_norm, c.eps)
        x = x + block.w2(F.silu(block.w1(n)) * block.w3(n))
    last = torch.tensor(bounds[1:], device=device) - 1
    return model.out(rms_norm(x[last], model.norm, c.eps))
