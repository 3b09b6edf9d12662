"""Part 2, parallelism: training on many GPUs, the collectives it needs and the networks that carry them.

Modules, grouped by chapter cluster: ``comm`` (collectives and networks), ``data`` (DDP, ZeRO,
FSDP), ``model`` (tensor, sequence and pipeline parallelism, activation memory), ``mixed_precision``,
``planning`` and ``frontier`` (part 2c); ``training`` and ``memory``, which every chapter uses, stay at
the top. Import each by its path, e.g. ``from utils.parallel.comm.network import
ring_allreduce_time``; nothing is re-exported here:

- :mod:`utils.parallel.training`: training FLOPs (6ND), training time, MFU;
- :mod:`utils.parallel.comm.collectives`: the ring all-reduce built from send/recv;
- :mod:`utils.parallel.comm.network`: alpha-beta cost models of all-reduce, on one
  level and across NVLink and a scale-out fabric;
- :mod:`utils.parallel.comm.bandwidth`: link rates in Gb/s to bytes/s, and
  nccl-tests' algorithm and bus bandwidth;
- :mod:`utils.parallel.comm.nccl_allreduce` and :mod:`utils.parallel.comm.nccl_protocols`: what NCCL's
  all-reduce reaches in one NVLink domain, with the protocol its tuning model picks by size;
- :mod:`utils.parallel.comm.topology`: switch fabrics (Clos, fat tree), their size
  and cost, and the published figures of real ones;
- :mod:`utils.parallel.comm.wiring`: every cable of a small fabric, shortest paths,
  ECMP collisions;
- :mod:`utils.parallel.data.data_parallel`: gradient all-reduce, DDP's bucketing
  rule and bucketed DDP, ZeRO-1, bytes held per rank;
- :mod:`utils.parallel.data.fsdp_schedule`: one FSDP step unit by unit on a compute and a communication
  stream, with and without prefetch, and the memory it holds over time;
- :mod:`utils.parallel.data.fsdp_costs`: hybrid sharding's (HSDP) memory and traffic, and the bytes of
  FSDP2's mixed-precision policy;
- :mod:`utils.parallel.data.fsdp`: ZeRO-3 built from forward and backward hooks (gather, free, reduce-scatter
  per unit; mixed precision; prefetch), the reference for lab 03's third stage;
- :mod:`utils.parallel.data.zero`: ZeRO-2, each gradient reduce-scattered from a backward hook;
- :mod:`utils.parallel.data.harness`: a tiny training run on one process or on N
  ranks with any strategy (ours, PyTorch DDP, FSDP2), the labs' yardstick;
- :mod:`utils.parallel.memory`: ZeRO's model-state memory and traffic per GPU, activation bytes
  per layer (Korthikanti et al. 2022, Table 2), tensor parallelism's all-reduce size;
- :mod:`utils.parallel.data.overlap`: how much of DDP's all-reduce hides behind backward, and the tokens
  per GPU above which DP and FSDP communication can hide at all;
- :mod:`utils.parallel.model.tensor_parallel`: Megatron-LM tensor parallelism: f and g, column- and
  row-parallel linears, the tensor-parallel MLP and attention split by heads;
- :mod:`utils.parallel.model.sequence_parallel`: sequence parallelism's all-gather / reduce-scatter
  along the sequence as autograd functions, the linear that saves only the sequence slice and
  all-gathers it again in backward, and the all-reduce of replicated (LayerNorm) gradients;
- :mod:`utils.parallel.model.saved_activations`: the bytes autograd saves for backward, measured;
- :mod:`utils.parallel.model.paper_layer`: the GPT layer Korthikanti et al. count, on one process and
  tensor + sequence parallel (34/t, measured);
- :mod:`utils.parallel.model.vocab_parallel`: the vocabulary-parallel embedding and cross-entropy;
- :mod:`utils.parallel.model.head_sharding`: query and KV heads per tensor-parallel rank under GQA;
- :mod:`utils.parallel.model.dropout_rng`: Megatron's dropout RNG tracker (shared and per-rank streams);
- :mod:`utils.parallel.frontier.context_parallel`: ring attention over a ring of ranks (forward and backward),
  contiguous and zigzag sequence sharding, causal work per rank, when K/V transfers hide;
- :mod:`utils.parallel.frontier.ulysses`: DeepSpeed-Ulysses' all-to-alls between sequence and head sharding
  around local attention, its head-count limit and bytes per GPU;
- :mod:`utils.parallel.frontier.moe`: a mixture-of-experts layer on one process: top-k softmax and DeepSeek-V3's
  sigmoid-with-bias routers, the bias update, the load-balancing loss, capacity and GShard's dropping order;
- :mod:`utils.parallel.frontier.expert_parallel`: the experts split over ranks, tokens dispatched and combined by
  two differentiable all-to-alls, their bytes and their alpha-beta time, DeepSeek-V3's node-limited routing;
- :mod:`utils.parallel.frontier.moe_costs`: total against activated parameters and FLOPs per token of MoE models
  (Mixtral 8x7B, DeepSeek-V3) against their stated sizes;
- :mod:`utils.parallel.model.pipeline`: pipeline schedules (GPipe, 1F1B, interleaved 1F1B)
  simulated, their bubble against the closed forms, micro-batches in flight;
- :mod:`utils.parallel.model.zero_bubble`: zero-bubble schedules (Qi et al. 2024): 1F1B, ZB-H1 and ZB-H2 with
  the backward split into B and W, their bubble and peak memory per stage;
- :mod:`utils.parallel.model.pipeline_exec`: a schedule run for real, one stage per rank,
  activations and gradients by send/recv, with busy time and stored bytes;
- :mod:`utils.parallel.model.pipeline_plots`: Gantt charts and animations of schedules;
- :mod:`utils.parallel.model.activations`: the tensors one GPT layer stores for backward, tensor by
  tensor, and the first pipeline stage's activation memory (Korthikanti et al. 2022);
- :mod:`utils.parallel.mixed_precision.precision`: fp32, tf32, fp16, bf16 and FP8 formats derived from their
  bit counts, a value's bit fields, model-state bytes per parameter of a training recipe;
- :mod:`utils.parallel.mixed_precision.loss_scaling`: dynamic loss scaling with GradScaler's rules, and a small
  model whose fp16 gradients underflow;
- :mod:`utils.parallel.mixed_precision.fp8_scaling`: FP8 casts with one scale per block (per tensor, DeepSeek-V3's
  1x128 activation tiles and 128x128 weight blocks) and what the round trip loses;
- :mod:`utils.parallel.model.recompute_flops`: FLOPs per iteration with and without recomputation
  (Korthikanti et al., appendix A), as printed and corrected;
- :mod:`utils.parallel.model.logits_memory`: the bytes of fp32 logits, and a chunked cross-entropy that
  never holds them all;
- :mod:`utils.parallel.mixed_precision.precision_plots`: bit layouts, format ranges, gradient histograms, loss
  and loss-scale curves;
- :mod:`utils.parallel.planning.transformer_costs`: parameters and matmul FLOPs of a decoder-only
  transformer (GQA, gated FFN);
- :mod:`utils.parallel.planning.planner`: memory per GPU and step time of a DP x TP x PP layout, fits or
  not, MFU;
- :mod:`utils.parallel.model.stage_memory`: bytes per GPU on each pipeline stage: model state, and the
  activations in flight counted on Megatron's schedule (interleaving, unequal chunks);
- :mod:`utils.parallel.planning.published_runs`: Megatron-LM and Llama 3 runs with their layouts, and the
  planner against them;
- :mod:`utils.parallel.planning.planner_5d`: the planner with context parallelism (dense) and expert
  parallelism (MoE): CP's K/V ring and EP's all-to-alls priced, whether they hide;
- :mod:`utils.parallel.planning.published_runs_5d`: Llama 3's 128K row (CP 16) and DeepSeek-V3's run
  (PP 16, EP 64) against planner_5d, with the errors;
- :mod:`utils.parallel.planning.planner_plots`: the device-mesh, plan and comparison figures of the
  planning chapter.

Used by the chapters of ``chapters/02-parallelism/``: 01 why many GPUs
(training, memory), 02 collectives (network, bandwidth), 03 DP and DDP
(data_parallel, network, bandwidth, overlap), 04 ZeRO and FSDP (memory,
data_parallel, fsdp, fsdp_schedule, fsdp_costs, overlap), 05 GPU networking (topology, wiring, bandwidth, network), 06
tensor parallelism (tensor_parallel, sequence_parallel, saved_activations, paper_layer,
vocab_parallel, head_sharding, dropout_rng, memory, network), 07 pipeline parallelism
(pipeline, zero_bubble, pipeline_plots), 08 activation memory (activations,
recompute_flops, logits_memory, memory), 09 mixed precision (precision, loss_scaling,
fp8_scaling, precision_plots, memory), 11 mixture of experts (moe, moe_costs,
expert_parallel), 12 expert parallelism (expert_parallel, moe, moe_costs), 13 planning a training run (planner, stage_memory,
transformer_costs, published_runs, planner_plots, memory, network);
by the labs of ``labs/02-parallelism/``: 01 ring all-reduce (collectives,
network), 02 DDP from scratch (data_parallel, harness, network), 03 ZeRO and
FSDP (data_parallel, zero, fsdp, harness, memory), 04 tensor-parallel MLP
(tensor_parallel, sequence_parallel, vocab_parallel), 05 pipeline schedules (pipeline,
pipeline_exec, pipeline_plots, zero_bubble), 06 activation checkpointing (activations,
recompute_flops, memory), 07 loss scaling (loss_scaling, precision, precision_plots); and by the multi-process
benchmarks in ``benchmarks/``.
"""
