"""Part 5, serving: what an inference server does with the GPU between a request and its last token.

Modules:

- :mod:`utils.serving.hf_bridge`: the book's tiny LLaMA as a Hugging Face
  ``LlamaForCausalLM`` (same weights, same logits), to hold the book's engines
  against ``transformers``' own;
- :mod:`utils.serving.prefix_hash`: chained hashes of full KV blocks, the key
  of vLLM's automatic prefix caching;
- :mod:`utils.serving.quant`: group-wise round-to-nearest weight quantisation
  (int8, packed int4) and an int8 / FP8 KV cache, with their bytes per element
  (the Triton matmul that reads them is :mod:`utils.kernels.quant_matmul`).
"""
