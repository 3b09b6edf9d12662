"""Part 3, attention variants: what modern decoder-only models compute in attention, and what it costs.

Modules:

- :mod:`utils.attention.llama`: RMSNorm, SwiGLU, RoPE, grouped-query
  attention with a KV cache, and a tiny LLaMA-style decoder built from them;
- :mod:`utils.attention.rope`: RoPE's two layouts (Meta's interleaved pairs, Hugging Face's
  NeoX halves) and the q/k weight permutation between them;
- :mod:`utils.attention.rope_scaling`: long-context RoPE: what position interpolation,
  NTK-aware scaling, YaRN and Llama 3.1 do to each frequency;
- :mod:`utils.attention.llama_sizes`: the parameter count of a LLaMA-style decoder, by kind,
  and LLaMA-1's published sizes (Table 2) to check it against;
- :mod:`utils.attention.mla`: multi-head latent attention, naive and with
  the up-projections absorbed, with the RMSNorms on the latents (DeepSeek-V2), and the
  checkpoints' weight names;
- :mod:`utils.attention.flash_reference`: online softmax, FlashAttention's
  tiled forward and recomputing backward in plain PyTorch, and its HBM traffic;
- :mod:`utils.attention.flash_plots`: the FlashAttention chapter's figures (online-softmax
  and tiling animation frames, HBM bytes against N, the roofline placement);
- :mod:`utils.attention.peak_memory`: peak bytes of tensor storage a call allocates, on
  a CPU or a GPU (a dispatch mode that tracks storages);
- :mod:`utils.attention.kv_cache`: KV-cache bytes of MHA, GQA, MQA and MLA, with sliding
  windows, and the configurations of LLaMA-2, Llama 3, Mistral, DeepSeek 67B and DeepSeek-V2/V3;
- :mod:`utils.attention.paged_cache`: a paged KV cache with block tables and
  copy-on-write (vLLM's PagedAttention memory manager);
- :mod:`utils.attention.paged_attention`: decode attention that reads K/V through a paged
  cache's block tables (online softmax per block), and the contiguous reference it must equal;
- :mod:`utils.attention.decode_cost`: why decode is memory-bound: FLOPs, HBM bytes and tokens/s
  of one decode step on a roofline, the batch whose caches fit;
- :mod:`utils.attention.serving_plots`: the serving chapter's figures (decode on the roofline,
  block tables, where KV memory goes);
- :mod:`utils.attention.allocation`: a serving simulator of the memory that
  contiguous and paged allocation waste, against the vLLM paper's Figure 2.

The calculators and the paged cache are re-exported here
(``utils.attention.kv_cache_bytes``, ``utils.attention.PagedKVCache``), the
names part 3's pages and tests use.
"""

from utils.attention.kv_cache import MODELS, AttentionConfig, kv_cache_bytes, mla_kv_cache_bytes
from utils.attention.paged_cache import OutOfBlocksError, PagedKVCache

__all__ = ["MODELS", "AttentionConfig", "OutOfBlocksError", "PagedKVCache", "kv_cache_bytes",
           "mla_kv_cache_bytes"]
