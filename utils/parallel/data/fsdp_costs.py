"""Bytes of FSDP's variants: hybrid sharding (HSDP) and FSDP2's mixed-precision policy.

**HSDP** (Zhao et al., "PyTorch FSDP", VLDB 2023, arXiv:2304.11277, section 3.2.2, hybrid
sharding; FSDP1's ``ShardingStrategy.HYBRID_SHARD``, FSDP2's ``fully_shard`` with a 2-D
``DeviceMesh``, placements ``(Replicate(), Shard(0))``): the ``N`` GPUs form ``R = N / G``
groups of ``G`` (one node each). Each group is a full ZeRO-3 copy of the model, so a GPU
holds ``(2 + 2 + K) Psi / G`` bytes of model state. Per step each GPU all-gathers its
group's parameters twice and reduce-scatters the gradients inside the group,
``3 (G-1)/G Psi`` elements on NVLink, and then all-reduces its ``1/G`` slice of the
gradients with the GPUs holding the same slice in the other groups,
``2 (R-1)/R Psi / G`` elements on the network. ``G = N`` is plain FSDP.

**FSDP2's** ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``
(``torch/distributed/fsdp/_fully_shard/_fsdp_api.py``): the sharded parameters stay in
their original dtype (fp32, which is also the optimizer's master copy), the all-gather and
the compute run in ``param_dtype`` and the gradient reduction in ``reduce_dtype``; the
sharded gradients are cast back to the parameters' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from utils.validate import check_nonnegative, check_positive, check_positive_int


@dataclass(frozen=True)
class HsdpTraffic:
    """Bytes each GPU sends per step: inside its shard group (NVLink) and across replicas (network)."""

    shard_group_bytes: float
    replicate_group_bytes: float


def _check_groups(n_gpus: int, shard_size: int) -> tuple[int, int]:
    n_gpus = check_positive_int("n_gpus", n_gpus)
    shard_size = check_positive_int("shard_size", shard_size)
    if n_gpus % shard_size:
        raise ValueError(f"shard_size must divide n_gpus, got shard_size={shard_size}, n_gpus={n_gpus}")
    return n_gpus, shard_size


def hsdp_model_state_bytes(n_params: float, n_gpus: int, shard_size: int,
                           optimizer_bytes_per_param: float = 12) -> float:
    """Model-state bytes per GPU under HSDP: ``(2 + 2 + K) Psi / G``, whatever the number of replicas."""
    _check_groups(n_gpus, shard_size)
    psi = check_positive("n_params", n_params, finite=True)
    return (4 + check_nonnegative("optimizer_bytes_per_param", optimizer_bytes_per_param)) * psi / shard_size


def hsdp_traffic_bytes(n_params: float, n_gpus: int, shard_size: int, bytes_per_element: float = 2) -> HsdpTraffic:
    """Bytes one GPU sends per step under HSDP (ring collectives).

    Shard group: all-gather in forward and backward, reduce-scatter of the gradients,
    ``3 (G-1)/G Psi`` elements. Replicas: ring all-reduce of the GPU's ``Psi / G``
    reduced gradients over ``R = N / G`` replicas, ``2 (R-1)/R Psi / G`` elements.
    """
    n_gpus, g = _check_groups(n_gpus, shard_size)
    psi = check_positive("n_params", n_params, finite=True)
    b = check_positive("bytes_per_element", bytes_per_element, finite=True)
    r = n_gpus // g
    return HsdpTraffic(3 * (g - 1) / g * psi * b, 2 * (r - 1) / r * psi / g * b)


@dataclass(frozen=True)
class MixedPrecisionBytes:
    """Per parameter: bytes stored sharded (divide by N), bytes of one unit's buffers, bytes sent per step."""

    sharded_bytes: float
    gathered_param_bytes: float
    reduce_buffer_bytes: float
    sent_bytes: float


def fsdp_mixed_precision_bytes(param_dtype_bytes: float = 2, reduce_dtype_bytes: float = 4,
                               original_dtype_bytes: float = 4, optimizer_bytes_per_param: float = 8,
                               n_gpus: int | None = None) -> MixedPrecisionBytes:
    """What ``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` does to bytes, per parameter.

    Stored, sharded: the parameter and its gradient in the original dtype plus Adam's
    momentum and variance, ``2 o + K`` (16 with fp32 and ``K = 8``). A gathered unit holds
    ``param_dtype_bytes`` per parameter; its gradients wait for the reduce-scatter in a
    ``reduce_dtype_bytes`` buffer. Sent per step: two all-gathers in ``param_dtype`` and one
    reduce-scatter in ``reduce_dtype``, ``(2 p + r)`` times ``(N-1)/N`` (1 if ``n_gpus`` is None).
    """
    p = check_positive("param_dtype_bytes", param_dtype_bytes, finite=True)
    r = check_positive("reduce_dtype_bytes", reduce_dtype_bytes, finite=True)
    o = check_positive("original_dtype_bytes", original_dtype_bytes, finite=True)
    k = check_nonnegative("optimizer_bytes_per_param", optimizer_bytes_per_param, finite=True)
    ring = 1.0 if n_gpus is None else (check_positive_int("n_gpus", n_gpus) - 1) / n_gpus
    return MixedPrecisionBytes(2 * o + k, p, r, (2 * p + r) * ring)
