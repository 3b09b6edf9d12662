"""Part 5, serving: what an inference server does with the GPU between a request and its last token.

The engine (lab 1; chapters 2 and 3):

- :mod:`utils.serving.engine`: ``Engine``, continuous batching over a paged KV
  cache with chunked prefill, preemption and prefix caching; per-request TTFT
  and TPOT in steps and seconds, and the schedule of every step;
- :mod:`utils.serving.scheduler`: the policy (vLLM's): a token budget per step,
  admission by free blocks, preemption by recompute; static batching to compare;
- :mod:`utils.serving.block_pool`: reference-counted KV blocks, prefix caching,
  LRU eviction of free cached blocks;
- :mod:`utils.serving.prefix_hash`: chained SHA-256 hashes of full blocks, with a
  per-tenant salt (vLLM's automatic prefix caching);
- :mod:`utils.serving.paged_forward`: the tiny LLaMA's forward over a ragged batch
  of prefill chunks and decodes through block tables, with a plain, int8 or FP8
  KV cache;
- :mod:`utils.serving.batched_attention`: all of a step's decodes in one attention
  call per layer (Triton split-KV on a GPU, a batched gather elsewhere);
- :mod:`utils.serving.hf_bridge`: the tiny LLaMA as a ``transformers``
  ``LlamaForCausalLM``, and ``transformers``' own continuous batching on it.

Measuring and pricing a server (chapters 1, 2 and 6):

- :mod:`utils.serving.metrics`: TTFT, ITL, TPOT, SLO attainment, goodput;
- :mod:`utils.serving.trace`: Poisson request traces, replayed in steps or seconds;
- :mod:`utils.serving.step_time`: the roofline time of one engine step, TTFT and
  TPOT of a batch, the latency-throughput curve, Little's law; its figures in
  :mod:`utils.serving.step_time_plots`;
- :mod:`utils.serving.simulate`: the engine's scheduler without a model, each
  step priced by :mod:`~utils.serving.step_time`; figures of chapter 2 in
  :mod:`utils.serving.batching_plots`;
- :mod:`utils.serving.deployment`: tokens/s per GPU at a TPOT target under TP, DP
  attention and EP, held against :mod:`utils.serving.published_deployments`;
  figures in :mod:`utils.serving.deployment_plots`.

Prefix caching (chapter 3): :mod:`utils.serving.radix_tree` (SGLang's
RadixAttention), :mod:`utils.serving.prefix_workloads` (chat, few-shot and agent
streams, hit rates and the prefill they save), :mod:`utils.serving.prefix_plots`.

Speculative decoding (chapter 4, lab 2): :mod:`utils.serving.speculative`
(``accept_draft``, ``speculative_generate``, expected tokens and speed-up),
:mod:`utils.serving.speculative_plots`, :mod:`utils.serving.tiny_corpus` (trained
tiny targets and drafts), :mod:`utils.serving.goodness_of_fit` (chi-square).

Quantisation (chapter 5, labs 3 and 4): :mod:`utils.serving.quant` (group-wise
int8/int4 weights, int8/FP8 KV), :mod:`utils.serving.quant_model` (quantised
models and their quality), :mod:`utils.serving.quant_cost` (bytes per decode
token per format). The kernels are :mod:`utils.kernels.split_kv_decode` and
:mod:`utils.kernels.quant_matmul`.
"""
