"""Checks of the lab "Assemble a 4D step": each of the reader's three pieces alone, then a whole run.

Each check raises :class:`~utils.hints.CheckFailed` naming the first thing that differs and what that
usually means, so a wrong piece is found before the 16-rank run that would only say "the losses differ".
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from utils.capstone.mesh import Mesh
from utils.capstone.parallel_4d import (
    CONFIG, Pieces, loss_share, local_tokens, make_batch, reference_losses, train,
)
from utils.hints import CheckFailed

LAYOUT = (2, 2, 2, 2)
"""The run the lab checks: every dimension at once, 16 gloo ranks."""
TP_REPLICATED = ("norm", "embed.weight", "out.weight")
HINTS = {
    "finish": "step 0's loss is right and a later one is not: the gradients (the update) differ; "
              "finish_gradients must sum the TP-replicated slices over the tp group.",
    "first loss": "the loss itself is off from step 0: check loss_share and local_tokens.",
    "replicated": "only parameters every tensor rank holds whole differ: each saw only its rank's tokens, so their "
                  "gradient slices (zero.shard_of(p).grad) must be summed over groups[('tp',)].",
    "sharded": "the sharded weights differ too: check the loss share and the tokens.",
    "off by tp": "off by tp: the tensor group splits the share's tokens, so the share has "
                 "targets.numel() * tp of them; the tp ranks' losses add up to the share's mean.",
}
"""The hint of each way the checks fail (the student-edition test plants one)."""


def _fail(what: str, hint: str) -> CheckFailed:
    return CheckFailed(f"{what}\nHint: {hint}", hint, None)


def check_local_tokens(fn: Callable[[torch.Tensor, Mesh, int], torch.Tensor]) -> None:
    """Every rank of two meshes gets the tokens :func:`~utils.capstone.parallel_4d.local_tokens` gives it, in order."""
    tokens, _ = make_batch(0)
    marked = torch.arange(tokens.numel()).view_as(tokens)  # each token's value is its own index
    for mesh in (Mesh(dp=2, tp=2, pp=2, cp=2), Mesh(dp=1, tp=2, cp=4)):
        for rank in range(mesh.world_size):
            got, want = fn(marked, mesh, rank), local_tokens(marked, mesh, rank)
            where = f"{mesh}, rank {rank} {mesh.coords(rank)}"
            if got is None:
                raise _fail(f"{where}: your function returned None.", "return the (batch, tokens) tensor of this rank.")
            if tuple(got.shape) != tuple(want.shape):
                raise _fail(f"{where}: shape {tuple(got.shape)}, expected {tuple(want.shape)}.",
                            "a rank holds batch / dp sequences of seq_len / (cp * tp) tokens each.")
            if torch.equal(got, want):
                continue
            rows, cols = set(got.div(tokens.shape[1], rounding_mode="floor").flatten().tolist()), \
                set((got % tokens.shape[1]).flatten().tolist())
            want_rows, want_cols = (set(want.div(tokens.shape[1], rounding_mode="floor").flatten().tolist()),
                                    set((want % tokens.shape[1]).flatten().tolist()))
            if rows != want_rows:
                hint = "the sequences: data rank i takes the i-th of dp equal slices of the batch (dim 0)."
            elif cols != want_cols:
                hint = ("the positions: context rank c holds zig-zag chunks c and 2*cp - 1 - c of 2*cp "
                        "(shard_sequence(..., 'zigzag', dim=1)), then tensor rank t the t-th of tp slices of that share.")
            else:
                hint = "the right tokens in the wrong order: keep the share's zig-zag order, then slice it."
            raise _fail(f"{where}: got positions {(got % tokens.shape[1]).tolist()[0]}, expected "
                        f"{(want % tokens.shape[1]).tolist()[0]}.", hint)


def check_loss_share(fn: Callable[[torch.Tensor, torch.Tensor, Mesh], torch.Tensor]) -> None:
    """The reader's share equals :func:`~utils.capstone.parallel_4d.loss_share` on random logits for a few meshes."""
    g = torch.Generator().manual_seed(0)
    for mesh in (Mesh(tp=1), Mesh(tp=2, cp=2), Mesh(dp=2, tp=4)):
        logits = torch.randn(2, 4, CONFIG.vocab, generator=g, dtype=torch.float64)
        targets = torch.randint(0, CONFIG.vocab, (2, 4), generator=g)
        got, want = fn(logits, targets, mesh), loss_share(logits, targets, mesh)
        if got is None:
            raise _fail(f"{mesh}: your function returned None.", "return a scalar tensor (it is backpropagated).")
        if not isinstance(got, torch.Tensor) or got.numel() != 1:
            raise _fail(f"{mesh}: expected a scalar tensor, got {got!r:.80}.", "sum the cross-entropy to one value.")
        ratio = float(got) / float(want)
        if abs(ratio - 1) > 1e-10:
            if abs(ratio - mesh.tp) < 1e-9 and mesh.tp > 1:
                hint = HINTS["off by tp"]
            elif abs(ratio * targets.numel() - 1) < 1e-9 or abs(ratio - 1 / targets.numel()) < 1e-9:
                hint = "a mean where a sum divided by the share's token count is needed (or the reverse)."
            else:
                hint = "sum the cross-entropy of this rank's tokens, then divide by its context share's tokens."
            raise _fail(f"{mesh}: your share is {float(got):.6g}, expected {float(want):.6g} "
                        f"(ratio {ratio:.4g}).", hint)


def check_training(pieces: Pieces, steps: int = 2) -> tuple[list[float], list[float]]:
    """Train ``steps`` Adam steps on (dp, tp, pp, cp) = (2, 2, 2, 2) with ``pieces`` and hold the losses and every
    final parameter to one process's in fp64 (1e-10). Returns (your losses, one process's)."""
    ref_losses, ref_params = reference_losses(steps=steps)
    losses, params = train(*LAYOUT, steps=steps, pieces=pieces)
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        if abs(a - b) > 1e-10:
            hint = HINTS["first loss"] if step == 0 else HINTS["finish"]
            raise _fail(f"step {step}: loss {a:.12f}, one process {b:.12f}.", hint)
    wrong = [n for n in ref_params if (params[n] - ref_params[n]).abs().max() > 1e-10]
    if wrong:
        only_replicated = all(n.endswith(TP_REPLICATED) for n in wrong)
        hint = HINTS["replicated"] if only_replicated else HINTS["sharded"]
        raise _fail(f"after {steps} steps {len(wrong)} parameters differ from one process's, first {wrong[0]}.", hint)
    return losses, ref_losses
