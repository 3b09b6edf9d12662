"""Collectives built from point-to-point messages: the ring all-reduce.

A ring all-reduce over n ranks splits the buffer into n chunks and runs two
phases of n - 1 steps each (Patarasuk and Yuan, "Bandwidth optimal all-reduce
algorithms for clusters of workstations", JPDC 2009):

* reduce-scatter: at step s, rank r sends chunk (r - s) mod n to its right
  neighbour and adds the chunk (r - s - 1) mod n arriving from its left one;
  after n - 1 steps rank r holds the full sum of chunk (r + 1) mod n;
* all-gather: at step s, rank r sends its finished chunk (r + 1 - s) mod n to
  the right and stores chunk (r - s) mod n from the left.

Each rank sends 2(n-1)/n of the buffer in total, whatever n is: this is what
makes the ring bandwidth-optimal.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from utils.validate import check_nonnegative_int, check_positive_int

# The flat-tensor reduce-scatter and all-gather, under the names this torch has: torch 2.13 (the book's
# pin) calls them reduce_scatter_single / all_gather_single and deprecates the older names
# reduce_scatter_tensor / all_gather_into_tensor, which are all that torch 2.11 has. Same arguments:
# (output, input[, op]) for reduce-scatter, (output, input) for all-gather.
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def chunk_bounds(numel: int, n_chunks: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``n_chunks`` contiguous [start, end) ranges differing in size by at most 1.

    The first ``numel % n_chunks`` chunks get one extra element; with fewer
    elements than chunks, the last chunks are empty.
    """
    check_nonnegative_int("numel", numel)
    check_positive_int("n_chunks", n_chunks)
    base, extra = divmod(numel, n_chunks)
    bounds, start = [], 0
    for i in range(n_chunks):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def _exchange(send: torch.Tensor, recv: torch.Tensor, right: int, left: int, group) -> None:
    """Send ``send`` to global rank ``right`` while receiving ``recv`` from global rank ``left``."""
    ops = []
    if send.numel():
        ops.append(dist.P2POp(dist.isend, send, right, group))
    if recv.numel():
        ops.append(dist.P2POp(dist.irecv, recv, left, group))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def ring_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum ``tensor`` over the ranks of ``group`` in place, with point-to-point messages only; return it.

    Works for any world size and any number of elements, including fewer
    elements than ranks and sizes the world size does not divide (chunks then
    differ by one element, and empty chunks are skipped). Every rank must call
    it with a tensor of the same shape and dtype. On a GPU with fewer elements
    than ranks, one barrier runs first (NCCL's rule for a first batched
    send/recv, see the comment in the code); otherwise only point-to-point
    messages are used.
    """
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"ring_all_reduce needs a torch.Tensor, got {type(tensor).__name__}")
    if not dist.is_initialized():
        raise ValueError("ring_all_reduce needs an initialised process group (use utils.dist.launch or torchrun)")
    n = dist.get_world_size(group)
    if n == 1 or tensor.numel() == 0:
        return tensor
    rank = dist.get_rank(group)
    right = dist.get_global_rank(group, (rank + 1) % n) if group is not None else (rank + 1) % n
    left = dist.get_global_rank(group, (rank - 1) % n) if group is not None else (rank - 1) % n

    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    chunks = [flat[start:end] for start, end in chunk_bounds(flat.numel(), n)]
    incoming = torch.empty_like(chunks[0])  # the largest chunk

    if flat.is_cuda and flat.numel() < n:
        # PyTorch's docs of batch_isend_irecv: with NCCL, if it is the first collective call in the group,
        # all ranks of the group must take part in it. With fewer elements than ranks some chunks are
        # empty and some ranks have nothing to send or receive at step 0, so an all-rank barrier on
        # this GPU goes first (needed only before the group's first collective; afterwards one tiny message).
        dist.barrier(group=group, device_ids=[flat.device.index])
    for step in range(n - 1):  # reduce-scatter
        send, recv = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
        buffer = incoming[: recv.numel()]
        _exchange(send, buffer, right, left, group)
        recv += buffer
    for step in range(n - 1):  # all-gather
        send, recv = chunks[(rank + 1 - step) % n], chunks[(rank - step) % n]
        _exchange(send, recv, right, left, group)

    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view_as(tensor))
    return tensor
