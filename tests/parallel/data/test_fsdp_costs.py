"""utils.parallel.data.fsdp_costs: HSDP and FSDP2's mixed precision against ZeRO's formulas at their limits."""

import pytest

from utils.parallel.data.fsdp_costs import fsdp_mixed_precision_bytes, hsdp_model_state_bytes, hsdp_traffic_bytes
from utils.parallel.memory import zero_communication_volume, zero_model_state_bytes

PSI, N = 7.5e9, 64


def test_hsdp_over_all_gpus_is_fsdp():
    assert hsdp_model_state_bytes(PSI, N, N) == pytest.approx(zero_model_state_bytes(PSI, N, 3))
    traffic = hsdp_traffic_bytes(PSI, N, N)
    assert traffic.shard_group_bytes == pytest.approx(2 * zero_communication_volume(PSI, 3, n_gpus=N))
    assert traffic.replicate_group_bytes == 0


def test_hsdp_with_groups_of_one_is_ddp():
    assert hsdp_model_state_bytes(PSI, N, 1) == pytest.approx(zero_model_state_bytes(PSI, N, 0))
    traffic = hsdp_traffic_bytes(PSI, N, 1)
    assert traffic.shard_group_bytes == 0
    assert traffic.replicate_group_bytes == pytest.approx(2 * zero_communication_volume(PSI, 0, n_gpus=N))


def test_hsdp_in_nodes_of_eight():
    """64 GPUs in 8 nodes of 8: 15 GB of state; 3 x 7/8 x 15 GB on NVLink, 2 x 7/8 x 15/8 GB on the network."""
    assert hsdp_model_state_bytes(PSI, N, 8) == pytest.approx(15e9)
    traffic = hsdp_traffic_bytes(PSI, N, 8)
    assert traffic.shard_group_bytes == pytest.approx(3 * 7 / 8 * 15e9)
    assert traffic.replicate_group_bytes == pytest.approx(2 * 7 / 8 * 15e9 / 8)


def test_mixed_precision_policy_bytes():
    bf16_fp32 = fsdp_mixed_precision_bytes(2, 4)
    assert bf16_fp32.sharded_bytes == 16  # fp32 param + fp32 grad + Adam's 8: ZeRO's 16 bytes, split differently
    assert bf16_fp32.sent_bytes == 2 * 2 + 4
    assert fsdp_mixed_precision_bytes(2, 2, n_gpus=N).sent_bytes == pytest.approx(
        2 * zero_communication_volume(1.0, 3, n_gpus=N))  # all bf16: ZeRO-3's 3 Psi elements of 2 bytes
    assert fsdp_mixed_precision_bytes(4, 4).sent_bytes == 12


@pytest.mark.parametrize("call, match", [
    (lambda: hsdp_model_state_bytes(PSI, 64, 6), "divide"),
    (lambda: hsdp_traffic_bytes(PSI, 0, 1), "n_gpus"),
    (lambda: hsdp_traffic_bytes(-1, 8, 8), "n_params"),
    (lambda: fsdp_mixed_precision_bytes(0, 4), "param_dtype_bytes"),
    (lambda: fsdp_mixed_precision_bytes(2, 4, n_gpus=0), "n_gpus"),
])
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
