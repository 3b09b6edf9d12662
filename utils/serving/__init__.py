"""Part 5, serving: what an inference server does with the GPU between a request and its last token.

Modules:

- :mod:`utils.serving.hf_bridge`: the book's tiny LLaMA as a Hugging Face
  ``LlamaForCausalLM`` (same weights, same logits), to hold the book's engines
  against ``transformers``' own;
- :mod:`utils.serving.prefix_hash`: chained hashes of full KV blocks, the key
  of vLLM's automatic prefix caching;
- :mod:`utils.serving.step_time`: the roofline time of one engine step (prefill
  chunks and decode sequences), TTFT, TPOT, the latency-throughput curve and
  Little's law (chapter "What an inference server optimises").
"""
