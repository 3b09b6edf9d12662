"""Part 5, serving: what an inference server does with the GPU between a request and its last token.

Modules:

- :mod:`utils.serving.hf_bridge`: the book's tiny LLaMA as a Hugging Face
  ``LlamaForCausalLM`` (same weights, same logits), to hold the book's engines
  against ``transformers``' own;
- :mod:`utils.serving.prefix_hash`: chained hashes of full KV blocks, the key
  of vLLM's automatic prefix caching;
- :mod:`utils.serving.step_time`: the roofline time of one engine step (prefill
  chunks and decode sequences), TTFT, TPOT, the latency-throughput curve and
  Little's law (chapter "What an inference server optimises");
- :mod:`utils.serving.deployment`: one GPU's step under tensor parallelism
  (KV heads split, then replicated), data-parallel attention and expert
  parallelism, and tokens/s per GPU at a TPOT target; held against
  :mod:`utils.serving.published_deployments` (DeepSeek's and SGLang's
  DeepSeek-V3 deployments) in chapter "Serving on many GPUs".
"""
