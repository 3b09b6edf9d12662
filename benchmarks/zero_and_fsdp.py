"""Benchmark of the lab "ZeRO-1 from scratch, then FSDP2": bytes per rank and step time.

Plain data parallelism with Adam, :class:`utils.parallel.data.data_parallel.ZeroOneOptimizer`
(ZeRO stage 1) and FSDP2's ``fully_shard`` (ZeRO stage 3) train the same MLP;
each is checked against one process on the full batch, and rank 0 prints the
bytes each rank holds next to the ZeRO formula (arXiv:1910.02054, Figure 1,
with fp32 weights and gradients and K = 8 bytes of Adam state per parameter)
and the median step time.

    torchrun --nproc-per-node=4 -m benchmarks.zero_and_fsdp      # NCCL, one GPU per rank
    python -m benchmarks.zero_and_fsdp --world-size 4             # gloo on the CPU, via utils.dist.launch
"""

from __future__ import annotations

from typing import Sequence

from benchmarks.ddp_from_scratch import check_and_report, parse_args, run
from utils.parallel.data import harness
from utils.parallel.memory import zero_model_state_bytes

K = 8  # fp32 Adam: momentum and variance, 4 bytes each


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv, __doc__.splitlines()[0])
    config, world_size, results = run(args, ("naive", "zero1", "fsdp2"), "adam", 1e-3)
    if results is None:
        return
    check_and_report(config, world_size, results)
    model = harness.make_mlp(config)
    psi = sum(p.numel() for p in model.parameters())
    plain = results["naive"]
    zero1_formula = zero_model_state_bytes(psi, world_size, 1, K) - zero_model_state_bytes(psi, world_size, 1, 0)
    stage3_ratio = zero_model_state_bytes(psi, world_size, 3, K) / zero_model_state_bytes(psi, world_size, 0, K)
    print(f"bytes on rank 0 (fp32, K = {K}):  params | grads | Adam state")
    for name, result in results.items():
        print(f"{name:>10}: {result['param_nbytes']:>12} | {result['grad_nbytes']:>12} | "
              f"{result['optimizer_state_nbytes']:>12}")
    assert plain["optimizer_state_nbytes"] == K * psi
    # ZeRO-1 pads the flat vector to N equal slices: at most K bytes more than the formula.
    assert 0 <= results["zero1"]["optimizer_state_nbytes"] - zero1_formula < K
    print(f"ZeRO-1 Adam state: formula K Psi / N_d = {zero1_formula:.0f}, "
          f"measured {results['zero1']['optimizer_state_nbytes']}")
    padded = any(p.shape[0] % world_size for p in model.parameters())
    for key in ("param_nbytes", "grad_nbytes", "optimizer_state_nbytes"):
        expected = plain[key] * stage3_ratio
        measured = results["fsdp2"][key]
        # FSDP2 pads dim 0 of each parameter to a multiple of N; rank 0 then holds slightly more.
        assert measured == expected if not padded else measured >= expected, (key, measured, expected)
        print(f"FSDP2 {key}: formula (plain DP x {stage3_ratio:g}) = {expected:.0f}, measured {measured}"
              + (" (dim 0 padded)" if padded else ""))


if __name__ == "__main__":
    main()
