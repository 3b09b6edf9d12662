"""Part 5, serving: what an inference server does with the GPU between a request and its last token.

Modules:

- :mod:`utils.serving.hf_bridge`: the book's tiny LLaMA as a Hugging Face
  ``LlamaForCausalLM`` (same weights, same logits), to hold the book's engines
  against ``transformers``' own;
- :mod:`utils.serving.prefix_hash`: chained hashes of full KV blocks, the key
  of vLLM's automatic prefix caching.
- :mod:`utils.serving.tiny_corpus`: a seeded synthetic corpus (a sparse Markov
  chain with copied spans) and the tiny target and draft models trained on it;
- :mod:`utils.serving.speculative`: speculative decoding, the rejection rule
  that keeps the target's distribution, and its expected speed-up
  (chapter 4, lab 2);
- :mod:`utils.serving.goodness_of_fit`: Pearson's chi-square test, to check that
  sampled tokens follow a distribution.
"""
