"""How tensor parallelism splits attention heads when keys and values have fewer heads (GQA, MQA).

Grouped-query attention (Ainslie et al., arXiv:2305.13245) gives ``n_heads``
query heads but only ``n_kv_heads`` key/value heads, each shared by
``n_heads / n_kv_heads`` query heads. Megatron's head split (Shoeybi et al.,
Figure 3b) needs every rank to hold whole KV heads with the query heads that
use them, so ``t`` must divide ``n_kv_heads``, not only ``n_heads``:

* Megatron-LM refuses anything else: its attention computes
  ``num_query_groups_per_partition = divide(num_query_groups, world_size)``,
  and ``divide`` asserts divisibility (``megatron/core/transformer/attention.py``).
* vLLM, for inference, lets ``t`` exceed ``n_kv_heads`` by *replicating* KV
  heads: ``QKVParallelLinear`` (``vllm/model_executor/layers/linear.py``) gives
  each rank one KV head and sets ``num_kv_head_replicas = t / n_kv_heads``
  (``t`` must then be a multiple of ``n_kv_heads``). Each KV weight and each
  KV-cache entry is then stored ``t / n_kv_heads`` times over the group.

Llama 3 70B and 405B have 8 KV heads (Llama 3 paper, arXiv:2407.21783, Table 3),
so Megatron-style training stops at ``t = 8``, which is the size of an NVLink
node anyway.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HeadSharding:
    """Heads on each of ``t`` ranks: query heads, KV heads, and how many ranks hold a copy of each KV head."""

    q_heads_per_rank: int
    kv_heads_per_rank: int
    kv_replicas: int  # 1 when the KV heads are split, t / n_kv_heads when replicated

    @property
    def kv_memory_factor(self) -> int:
        """Total KV-weight and KV-cache memory over the group, in units of the unsplit model's: ``kv_replicas``."""
        return self.kv_replicas


def kv_head_sharding(n_heads: int, n_kv_heads: int, tp: int, replicate_kv: bool = False) -> HeadSharding:
    """Split ``n_heads`` query and ``n_kv_heads`` key/value heads over ``tp`` ranks, Megatron's way or vLLM's.

    ``replicate_kv=False`` (Megatron-LM, training): ``tp`` must divide
    ``n_kv_heads``. ``replicate_kv=True`` (vLLM, inference): when ``tp >
    n_kv_heads``, each rank holds one KV head and each KV head lives on
    ``tp / n_kv_heads`` ranks. Raises ``ValueError`` for sizes that do not
    divide, saying which ones and what is allowed.
    """
    for name, value in (("n_heads", n_heads), ("n_kv_heads", n_kv_heads), ("tp", tp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads}): each KV head serves a group")
    if n_heads % tp:
        raise ValueError(f"tensor parallelism over {tp} ranks needs n_heads divisible by {tp}, got {n_heads}")
    if n_kv_heads % tp == 0:
        return HeadSharding(n_heads // tp, n_kv_heads // tp, 1)
    if not replicate_kv:
        raise ValueError(f"tp = {tp} does not divide the {n_kv_heads} KV heads (Megatron-LM requires it); "
                         f"use tp in {[d for d in range(1, n_kv_heads + 1) if n_kv_heads % d == 0]} "
                         f"or replicate_kv=True (vLLM)")
    if tp % n_kv_heads:
        raise ValueError(f"replicating {n_kv_heads} KV heads over {tp} ranks needs tp to be a multiple of "
                         f"{n_kv_heads}")
    return HeadSharding(n_heads // tp, 1, tp // n_kv_heads)
