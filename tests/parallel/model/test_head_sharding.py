"""utils.parallel.model.head_sharding: GQA's KV heads bound tensor parallelism (Megatron) or get replicated (vLLM)."""

import pytest

from utils.parallel.model.head_sharding import HeadSharding, kv_head_sharding


def test_llama3_70b_splits_its_8_kv_heads_up_to_t_8():
    # Llama 3 70B: 64 query heads, 8 KV heads (arXiv:2407.21783, Table 3)
    assert kv_head_sharding(64, 8, 8) == HeadSharding(8, 1, 1)
    assert kv_head_sharding(64, 8, 2) == HeadSharding(32, 4, 1)
    with pytest.raises(ValueError, match=r"does not divide the 8 KV heads.*\[1, 2, 4, 8\]"):
        kv_head_sharding(64, 8, 16)


def test_vllm_replicates_kv_heads_beyond_their_number():
    s = kv_head_sharding(64, 8, 16, replicate_kv=True)
    assert s == HeadSharding(4, 1, 2) and s.kv_memory_factor == 2
    assert kv_head_sharding(32, 1, 4, replicate_kv=True) == HeadSharding(8, 1, 4)  # multi-query attention
    with pytest.raises(ValueError, match="multiple of 8"):
        kv_head_sharding(48, 8, 12, replicate_kv=True)


def test_multi_head_attention_is_the_case_n_kv_heads_equal_n_heads():
    assert kv_head_sharding(16, 16, 4) == HeadSharding(4, 4, 1)


@pytest.mark.parametrize("args, message", [((64, 8, 3), "n_heads divisible by 3"), ((64, 6, 2), "must divide"),
                                           ((64, 8, 0), "tp must be"), ((64, 8.0, 2), "n_kv_heads must be")])
def test_bad_sizes_raise(args, message):
    with pytest.raises(ValueError, match=message):
        kv_head_sharding(*args)
