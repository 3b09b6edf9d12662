"""Part 6, making a run fast and keeping it alive: profiling, compilers and fused kernels, checkpoints and failures.

Import each module by its path; nothing is re-exported here:

- :mod:`utils.production.profiled_step`: part 3's tiny LLaMA training step under ``torch.profiler``,
  on one process and as DDP on gloo ranks (with an optional straggler), each writing a Chrome trace;
- :mod:`utils.production.trace_timeline`: Chrome traces read back (lanes, nesting, self times, ranks
  merged on one clock) and drawn as an SVG timeline that needs no kernel;
- :mod:`utils.production.checkpoint_interval`: how often to checkpoint (Young 1974, Daly 2006), the
  expected wall time and goodput of a run that fails and restarts, a cluster's mean time between
  failures against its size, and Llama 3's interruption counts.
"""
