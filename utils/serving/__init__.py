"""Part 5, serving: what an inference server does with the GPU between a request and its last token.

Modules:

- :mod:`utils.serving.hf_bridge`: the book's tiny LLaMA as a Hugging Face
  ``LlamaForCausalLM`` (same weights, same logits), to hold the book's engines
  against ``transformers``' own;
- :mod:`utils.serving.prefix_hash`: chained hashes of full KV blocks, the key
  of vLLM's automatic prefix caching;
- :mod:`utils.serving.block_pool`: reference-counted KV blocks with prefix
  caching and LRU eviction of free cached blocks (vLLM's block pool);
- :mod:`utils.serving.metrics`: TTFT, ITL, TPOT, end-to-end latency and
  goodput under an SLO, from the times a request's tokens appear.
"""
