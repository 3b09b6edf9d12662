"""Published large-scale deployments of DeepSeek-V3 to hold :mod:`utils.serving.many_gpus.deployment` against.

Two sources, their conditions checked against the text:

- DeepSeek-AI, "Day 6: One More Thing, DeepSeek-V3/R1 Inference System
  Overview" (github.com/deepseek-ai/open-infra-index, Open Source Week,
  February 2025): prefill with routed experts EP32 and MLA/shared expert DP32
  over 4 nodes (9 routed and 1 shared expert per GPU); decode EP144/DP144 over
  18 nodes (2 routed + 1 shared per GPU), 32 redundant experts; H800 GPUs.
  "Each H800 node delivers an average throughput of ~73.7k tokens/s input
  (including cache hits) during prefilling or ~14.8k tokens/s output during
  decoding", over 24 hours of production traffic, 56.3% of input tokens hitting
  the on-disk KV cache, an average KV length of 4,989 tokens per output token,
  and 20-22 tokens/s per user. Its profile runs (github.com/deepseek-ai/profile-data,
  README) are EP32 prefill with 4K prompts and 16K tokens per GPU, and EP128
  decode with 4K prompts and 128 requests per GPU; two micro-batches overlap
  computation and all-to-all in both.
- LMSYS (the SGLang team), "Deploying DeepSeek with PD Disaggregation and
  Large-Scale Expert Parallelism on 96 H100 GPUs" (lmsys.org/blog/2025-05-05-large-scale-ep/):
  prefill on 4 nodes (EP32) at 57,674, 54,543 and 50,302 tokens/s per node for
  1K, 2K and 4K prompts; decode on 9 nodes (EP72) at 22,282 tokens/s per node
  with 256 sequences per GPU and 2,000-token contexts, and 17,373 with
  simulated MTP (128 sequences, 4,000 tokens). Its comparison table also gives
  the per-node throughput of DeepSeek's profile runs: 62,713 prefill and 18,598
  decode, and the blog's production prefill without cache hits, 32,206.

What the sources leave out, and what the rows assume. The H800 is modelled as
an H100 SXM: NVIDIA's H800 SXM has the H100's compute and HBM and a reduced
NVLink (400 GB/s), which data-parallel attention with expert parallelism does
not use for its all-to-alls here (they go over the network). Every GPU has a
400 Gb/s (50 GB/s) network link (DeepSeek-V3 report, arXiv:2412.19437,
section 3.2.2: "IB (50 GB/s)"; the same ConnectX-7 per GPU as a DGX H100 for
the SGLang cluster). Weights and expert matmuls in FP8 (the released
checkpoint), KV cache and attention in bf16, dispatch in FP8 and combine in
bf16 (DeepEP). MTP rows compute 2 tokens per sequence per step and keep 1.875
(the report's 85-90% acceptance of the second token, section 5.4.3).
Prefill rows send each token to at most 4 nodes (node-limited routing,
section 2.1.2); decode rows send every expert copy over the network.
"""

from __future__ import annotations

from typing import NamedTuple

from utils.published import Published
from utils.serving.many_gpus.deployment import Layout, ModelShape, moe_shape, step, tokens_per_gpu_per_s

DEEPSEEK_DAY6 = ("DeepSeek-AI, 'DeepSeek-V3/R1 Inference System Overview', open-infra-index, Open Source Week "
                 "day 6 (2025)")
LMSYS = ("LMSYS, 'Deploying DeepSeek with PD Disaggregation and Large-Scale Expert Parallelism on 96 H100 GPUs' "
         "(2025-05-05), section 'Profile Results'")
GPUS_PER_NODE = 8
MTP_ACCEPTED = 1.875
"""1 + the midpoint of DeepSeek-V3's 85-90% acceptance of its second (MTP) token (arXiv:2412.19437, section 5.4.3)."""

_FP8 = dict(weight_bytes=1.0, matmul_precision="fp8", redundant_experts=32)

DAY6_OUTPUT_TOKENS_PER_S_PER_NODE = 14_800
DAY6_OUTPUT_TOKENS_PER_S_PER_USER = 21.0
"""The midpoint of the Day 6 overview's "average output speed" of 20-22 tokens per second per request."""
PRODUCTION_DECODE_BATCH = round(DAY6_OUTPUT_TOKENS_PER_S_PER_NODE / GPUS_PER_NODE / DAY6_OUTPUT_TOKENS_PER_S_PER_USER)
"""Sequences per GPU in DeepSeek's production decode, by Little's law on Day 6's own averages: a GPU's
1,850 output tokens/s over each request's 21 tokens/s is 88 requests decoding at once."""


class PublishedDeployment(NamedTuple):
    """A published serving run: what ran, how it was split, at what load, and what it achieved."""

    name: str
    phase: str  # "prefill" or "decode"
    layout: Layout
    batch_per_gpu: int  # sequences per GPU (decode) or prompts per GPU (prefill)
    context: int  # tokens attended to (decode) or prompt length (prefill)
    tokens_per_s_per_node: Published
    production: bool = False


ROWS: tuple[PublishedDeployment, ...] = (
    PublishedDeployment("DeepSeek production decode (EP144, MTP)", "decode",
                        Layout(ep=144, tokens_per_step=2, accepted_per_step=MTP_ACCEPTED, **_FP8),
                        PRODUCTION_DECODE_BATCH, 4989,
                        Published(DAY6_OUTPUT_TOKENS_PER_S_PER_NODE, "output tokens/s per H800 node",
                                  f"{DEEPSEEK_DAY6}, 'Cost and Theoretical Income'; batch per GPU by Little's law from "
                                  "its average output speed of 20-22 tokens/s per request", "measured"), True),
    PublishedDeployment("DeepSeek profile decode (EP128, MTP)", "decode",
                        Layout(ep=128, tokens_per_step=2, accepted_per_step=MTP_ACCEPTED, **_FP8), 128, 4096,
                        Published(18_598, "output tokens/s per H800 node", f"{LMSYS}, decode table, "
                                  "'DeepSeek Profile' column", "measured")),
    PublishedDeployment("SGLang decode (EP72)", "decode", Layout(ep=72, **_FP8), 256, 2000,
                        Published(22_282, "output tokens/s per H100 node", f"{LMSYS}, decode table", "measured")),
    PublishedDeployment("SGLang decode (EP72, simulated MTP)", "decode",
                        Layout(ep=72, tokens_per_step=2, accepted_per_step=MTP_ACCEPTED, **_FP8), 128, 4000,
                        Published(17_373, "output tokens/s per H100 node", f"{LMSYS}, decode table, 'SGLang + "
                                  "Simulated MTP (Slow Attention)'", "measured")),
    PublishedDeployment("DeepSeek profile prefill (EP32)", "prefill", Layout(ep=32, nodes_per_token=4, **_FP8), 4,
                        4096, Published(62_713, "input tokens/s per H800 node", f"{LMSYS}, prefill table, "
                                        "'DeepSeek Profile' column (16,384 tokens per GPU)", "measured")),
    PublishedDeployment("SGLang prefill (EP32), 4K prompts", "prefill", Layout(ep=32, nodes_per_token=4, **_FP8), 4,
                        4096, Published(50_302, "input tokens/s per H100 node", f"{LMSYS}, 'Prefill Phase'",
                                        "measured")),
    PublishedDeployment("SGLang prefill (EP32), 1K prompts", "prefill", Layout(ep=32, nodes_per_token=4, **_FP8), 16,
                        1024, Published(57_674, "input tokens/s per H100 node", f"{LMSYS}, 'Prefill Phase'",
                                        "measured")),
)
"""The published rows; the 1K and 4K prefill rows assume 16,384 tokens per GPU, as the 4K profile states."""


class Comparison(NamedTuple):
    """A row's roofline bound against its published figure: ``achieved = published / bound``.

    ``binds`` names the term that sets the bound's step: ``"network"`` when the all-to-alls outlast the
    computation they overlap, else ``"compute"``. ``compute_bound_per_node`` is the bound with the network
    free, so a network-bound row can be read both ways: against the link, and against the GPU.
    """

    row: PublishedDeployment
    bound_per_node: float
    achieved: float
    binds: str
    compute_bound_per_node: float


def hold_against(rows: tuple[PublishedDeployment, ...] = ROWS, model: ModelShape | None = None) -> list[Comparison]:
    """Each row's tokens/s per node by :func:`utils.serving.many_gpus.deployment.tokens_per_gpu_per_s` (modelled on an
    H100 SXM), and the fraction of it the deployment achieved."""
    model = model or moe_shape("DeepSeek-V3")
    out = []
    for row in rows:
        prefill = row.phase == "prefill"
        per_gpu = tokens_per_gpu_per_s(model, row.layout, row.batch_per_gpu, row.context, "H100-SXM",
                                       prefill=prefill)
        bound = GPUS_PER_NODE * per_gpu
        s = step(model, row.layout, row.batch_per_gpu, row.context, "H100-SXM", prefill)
        compute_only = bound * s.seconds / s.compute
        out.append(Comparison(row, bound, row.tokens_per_s_per_node.value / bound,
                              "network" if s.comm > s.compute else "compute", compute_only))
    return out
