"""Part 5, serving: what an inference server does with the GPU between a request and its last token.

Modules:

- :mod:`utils.serving.hf_bridge`: the book's tiny LLaMA as a Hugging Face
  ``LlamaForCausalLM`` (same weights, same logits), to hold the book's engines
  against ``transformers``' own, and its continuous batching (``generate_batch``);
- :mod:`utils.serving.prefix_hash`: chained hashes of full KV blocks, the key
  of vLLM's automatic prefix caching;
- :mod:`utils.serving.block_pool`: reference-counted KV blocks with prefix
  caching and LRU eviction of free cached blocks (vLLM's block pool);
- :mod:`utils.serving.paged_forward`: the tiny LLaMA's forward over a ragged
  batch of prefill chunks and decodes, K/V read and written through block tables;
- :mod:`utils.serving.scheduler`: continuous (or static) batching with a token
  budget per step, chunked prefill, admission by free blocks and preemption by
  recompute (vLLM's scheduler);
- :mod:`utils.serving.engine`: the engine that puts them together, with
  per-request TTFT and TPOT in steps and seconds (``Engine``);
- :mod:`utils.serving.trace`: Poisson request traces, replayed through an engine
  in steps (the same on every machine) or in wall-clock seconds;
- :mod:`utils.serving.metrics`: TTFT, ITL, TPOT, end-to-end latency and
  goodput under an SLO, from the times a request's tokens appear.
- :mod:`utils.serving.quant`: group-wise round-to-nearest weight quantisation
  (int8, packed int4) and an int8 / FP8 KV cache, with their bytes per element
  (the Triton matmul that reads them is :mod:`utils.kernels.quant_matmul`);
- :mod:`utils.serving.tiny_corpus`: a seeded synthetic corpus (a sparse Markov
  chain with copied spans) and the tiny target and draft models trained on it;
- :mod:`utils.serving.speculative`: speculative decoding, the rejection rule
  that keeps the target's distribution, and its expected speed-up
  (chapter 4, lab 2);
- :mod:`utils.serving.goodness_of_fit`: Pearson's chi-square test, to check that
  sampled tokens follow a distribution.
- :mod:`utils.serving.step_time`: the roofline time of one engine step (prefill
  chunks and decode sequences), TTFT, TPOT, the latency-throughput curve and
  Little's law (chapter "What an inference server optimises");
- :mod:`utils.serving.deployment`: one GPU's step under tensor parallelism
  (KV heads split, then replicated), data-parallel attention and expert
  parallelism, and tokens/s per GPU at a TPOT target; held against
  :mod:`utils.serving.published_deployments` (DeepSeek's and SGLang's
  DeepSeek-V3 deployments) in chapter "Serving on many GPUs".
"""
