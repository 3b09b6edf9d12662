"""How many bytes a model's training state takes on each GPU.

Mixed-precision training with Adam keeps, per parameter, an fp16 weight
(2 bytes), an fp16 gradient (2 bytes) and ``K`` bytes of optimizer state: an
fp32 master weight, momentum and variance, ``K = 12`` (Rajbhandari et al.,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
arXiv:1910.02054, section 3.1).
"""

from __future__ import annotations

ZERO_STAGES = (0, 1, 2, 3)


def zero_model_state_bytes(n_params: float, n_gpus: int, stage: int, optimizer_bytes_per_param: float = 12) -> float:
    """Model-state bytes per GPU under ZeRO ``stage`` with ``n_gpus``-way data parallelism.

    With Psi parameters, K optimizer bytes per parameter and N_d GPUs
    (ZeRO paper, Figure 1):

    - stage 0 (plain data parallelism): ``(2 + 2 + K) Psi``
    - stage 1 (optimizer states sharded): ``2 Psi + 2 Psi + K Psi / N_d``
    - stage 2 (+ gradients sharded): ``2 Psi + (2 + K) Psi / N_d``
    - stage 3 (+ parameters sharded): ``(2 + 2 + K) Psi / N_d``
    """
    if n_params <= 0:
        raise ValueError(f"n_params must be > 0, got {n_params}")
    if not isinstance(n_gpus, int) or isinstance(n_gpus, bool) or n_gpus < 1:
        raise ValueError(f"n_gpus must be a positive int, got {n_gpus!r}")
    if stage not in ZERO_STAGES or isinstance(stage, bool):
        raise ValueError(f"stage must be one of {ZERO_STAGES} (0 = plain data parallelism), got {stage!r}")
    if optimizer_bytes_per_param < 0:
        raise ValueError(f"optimizer_bytes_per_param must be >= 0, got {optimizer_bytes_per_param}")
    psi, k, nd = float(n_params), float(optimizer_bytes_per_param), n_gpus
    params, grads, optim = 2 * psi, 2 * psi, k * psi
    if stage >= 1:
        optim /= nd
    if stage >= 2:
        grads /= nd
    if stage >= 3:
        params /= nd
    return params + grads + optim
