"""Part 5, serving: what an inference server does with the GPU between a request and its last token.

Modules, grouped by chapter cluster like :mod:`utils.parallel`: ``runtime`` (the engine),
``costs`` (metrics, traces and the step-time model), ``prefix``, ``speculation``,
``quantisation`` and ``many_gpus``. Import each by its path, e.g. ``from
utils.serving.runtime.engine import Engine``; nothing is re-exported here. The flat paths
of the second edition (``utils.serving.engine``, ``utils.serving.step_time``, ...) still
import, as aliases of the same module objects (see :data:`MOVED`), so a reader's saved
notebook keeps working and patching a function through either path patches the one function.

The engine (lab 1; chapters 2 and 3):

- :mod:`utils.serving.runtime.engine`: ``Engine``, continuous batching over a paged KV
  cache with chunked prefill, preemption and prefix caching; per-request TTFT
  and TPOT in steps and seconds, and the schedule of every step;
- :mod:`utils.serving.runtime.scheduler`: the policy (vLLM's): a token budget per step,
  admission by free blocks, preemption by recompute; static batching to compare;
- :mod:`utils.serving.runtime.block_pool`: reference-counted KV blocks, prefix caching,
  LRU eviction of free cached blocks;
- :mod:`utils.serving.runtime.prefix_hash`: chained SHA-256 hashes of full blocks, with a
  per-tenant salt (vLLM's automatic prefix caching);
- :mod:`utils.serving.runtime.paged_forward`: the tiny LLaMA's forward over a ragged batch
  of prefill chunks and decodes through block tables, with a plain, int8 or FP8
  KV cache;
- :mod:`utils.serving.runtime.batched_attention`: all of a step's decodes in one attention
  call per layer (Triton split-KV on a GPU, a batched gather elsewhere);
- :mod:`utils.serving.runtime.hf_bridge`: the tiny LLaMA as a ``transformers``
  ``LlamaForCausalLM``, and ``transformers``' own continuous batching on it.

Measuring and pricing a server (chapters 1 and 2; chapter 6 in ``many_gpus``):

- :mod:`utils.serving.costs.metrics`: TTFT, ITL, TPOT, SLO attainment, goodput;
- :mod:`utils.serving.costs.trace`: Poisson request traces, replayed in steps or seconds;
- :mod:`utils.serving.costs.step_time`: the roofline time of one engine step, TTFT and
  TPOT of a batch, the latency-throughput curve, Little's law; its figures in
  :mod:`utils.serving.costs.step_time_plots`;
- :mod:`utils.serving.costs.calibrated`: the same step times over the fraction of the roof
  engines reach in each phase (fitted on the scorecard's fit rows), and steady-state
  continuous batching capped by the KV memory: an estimate beside the bound;
- :mod:`utils.serving.costs.simulate`: the engine's scheduler without a model, each
  step priced by :mod:`~utils.serving.costs.step_time`; figures of chapter 2 in
  :mod:`utils.serving.costs.batching_plots`;
- :mod:`utils.serving.many_gpus.deployment`: tokens/s per GPU at a TPOT target under TP, DP
  attention and EP, held against :mod:`utils.serving.many_gpus.published_deployments`;
  figures in :mod:`utils.serving.many_gpus.deployment_plots`.

Prefix caching (chapter 3): :mod:`utils.serving.prefix.radix_tree` (SGLang's
RadixAttention), :mod:`utils.serving.prefix.prefix_workloads` (chat, few-shot and agent
streams, hit rates and the prefill they save), :mod:`utils.serving.prefix.prefix_plots`.

Speculative decoding (chapter 4, lab 2): :mod:`utils.serving.speculation.speculative`
(``accept_draft``, ``speculative_generate``, expected tokens and speed-up),
:mod:`utils.serving.speculation.speculative_plots`, :mod:`utils.serving.speculation.tiny_corpus` (trained
tiny targets and drafts), :mod:`utils.serving.speculation.goodness_of_fit` (chi-square).

Quantisation (chapter 5, labs 3 and 4): :mod:`utils.serving.quantisation.quant` (group-wise
int8/int4 weights, int8/FP8 KV), :mod:`utils.serving.quantisation.quant_model` (quantised
models and their quality), :mod:`utils.serving.quantisation.quant_cost` (bytes per decode
token per format). The kernels are :mod:`utils.kernels.split_kv_decode` and
:mod:`utils.kernels.quant_matmul`.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

MOVED: dict[str, str] = {
    **dict.fromkeys(["engine", "scheduler", "scheduler_check", "block_pool", "prefix_hash", "paged_forward",
                     "batched_attention", "hf_bridge"], "runtime"),
    **dict.fromkeys(["metrics", "trace", "step_time", "step_time_plots", "simulate", "batching_plots"], "costs"),
    **dict.fromkeys(["radix_tree", "prefix_workloads", "prefix_plots"], "prefix"),
    **dict.fromkeys(["speculative", "speculative_plots", "tiny_corpus", "goodness_of_fit"], "speculation"),
    **dict.fromkeys(["quant", "quant_model", "quant_cost"], "quantisation"),
    **dict.fromkeys(["deployment", "deployment_plots", "published_deployments"], "many_gpus"),
}
"""Each module's second-edition name under ``utils.serving`` -> the subpackage that holds it now."""


class _Alias(importlib.abc.Loader):
    """Loads ``utils.serving.<old>`` as the module ``utils.serving.<cluster>.<old>`` itself."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        # The import system returns whatever sys.modules holds under the name once this returns.
        sys.modules[module.__name__] = importlib.import_module(self.target)


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the second-edition paths in :data:`MOVED`; every other name is left to the usual finders."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        package, _, leaf = fullname.rpartition(".")
        if package != __name__ or leaf not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(f"{__name__}.{MOVED[leaf]}.{leaf}"))


if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedFinder())
