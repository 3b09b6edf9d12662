"""Where KV-cache memory goes under contiguous and paged allocation: a serving simulator.

Kwon et al. ("Efficient Memory Management for Large Language Model Serving
with PagedAttention", arXiv:2309.06180, section 3 and Figure 2) split the KV
memory of a serving system into four parts:

- **token states**: slots holding the keys and values of tokens that exist;
- **reservation**: slots reserved for tokens a request will generate later;
- **internal fragmentation**: reserved slots the request will never use
  (it stopped before the length it reserved for);
- **external fragmentation**: free memory that cannot be used, because no
  free gap is large enough for the next request's contiguous reservation.

A contiguous allocator must reserve a request's maximum length up front. The
paper's three Orca baselines (section 6.1, "Baseline 2") differ in how much:
the model's maximum sequence length, 2048 tokens (``"max"``); the prompt plus
the true output length rounded up to a power of two, "over-reserves the space
for outputs by at most 2x ... if the true output length is 25, it reserves 32
positions" (``"pow2"``); or, with an oracle, exactly the true length
(``"oracle"``). A paged allocator (``"paged"``) takes a ``block_size``-token
block whenever a sequence fills its last one, so only the tail of the last
block is wasted. The paper "assume[s] Orca uses the buddy allocation algorithm
to determine the memory address to store KV cache" (section 6.1), and so does
:func:`simulate` by default: a reservation takes a block of the next power of
two, placed at a multiple of its size, and the slack counts as external
fragmentation (Figure 2's "External frag. & Others"). ``allocator="first_fit"``
places exact-size slabs in the first gap that fits, a stronger allocator than
the paper's baseline.

Figure 2 ("Average percentage of memory wastes in different LLM serving
systems during the experiment in section 6.2") shows 20.4%, 26.8% and 38.2% of
the KV memory holding token states for Orca (Max), (Pow2) and (Oracle), and
96.3% for vLLM (:data:`VLLM_TOKEN_STATE_SHARE`; every bar of the figure is in
:data:`VLLM_FIGURE2`). The "mere waste of under 4%" often quoted for vLLM is
from the vLLM blog post (Kwon et al., "vLLM: Easy, Fast, and Cheap LLM Serving
with PagedAttention", 20 June 2023), not from the paper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from utils.published import Published
from utils.validate import check_positive, check_positive_int

POLICIES = ("max", "pow2", "oracle", "paged")
ALLOCATORS = ("first_fit", "buddy")

_VLLM = "Kwon et al., 'Efficient Memory Management for Large Language Model Serving with PagedAttention', " \
        "SOSP 2023, arXiv:2309.06180, Figure 2"
COMPONENTS = ("token_states", "reservation", "internal", "external")
"""The four parts of KV memory in Figure 2, bottom to top."""
_FIGURE2 = {  # percent, bottom to top; Oracle has no internal fragmentation, vLLM's remaining 3.7% is unlabelled
    "max": (20.4, 13.3, 57.3, 8.9),
    "pow2": (26.8, 17.9, 13.6, 41.6),
    "oracle": (38.2, 25.2, 0.0, 36.6),
    "paged": (96.3, None, None, None),
}
VLLM_FIGURE2 = {
    policy: {part: Published(value / 100, f"share of KV-cache memory: {part.replace('_', ' ')}", _VLLM)
             for part, value in zip(COMPONENTS, values) if value is not None}
    for policy, values in _FIGURE2.items()
}
"""Every labelled bar of Figure 2, as a share (0 to 1), by policy and component.

The paper labels Orca's top component "External frag. & Others". Orca
(Oracle) shows no internal-fragmentation bar (it knows each output length);
vLLM's bar is labelled with its token-state share only.
"""
VLLM_TOKEN_STATE_SHARE = {policy: parts["token_states"] for policy, parts in VLLM_FIGURE2.items()}
"""Average share of KV memory used by token states, by allocation policy, as the vLLM paper measured it."""
SHAREGPT_MEAN_LENGTHS = {
    "prompt": Published(161.31, "tokens", "arXiv:2309.06180, Figure 11a legend: ShareGPT input (mean: 161.31)"),
    "output": Published(337.99, "tokens", "arXiv:2309.06180, Figure 11a legend: ShareGPT output (mean: 337.99)"),
}
"""Mean prompt and output lengths of the ShareGPT trace the paper synthesises its workloads from (section 6.1)."""


@dataclass(frozen=True)
class Request:
    """A request arriving at step ``arrival`` with a prompt and the number of tokens it will generate."""

    arrival: int
    prompt_len: int
    output_len: int

    @property
    def final_len(self) -> int:
        return self.prompt_len + self.output_len


@dataclass(frozen=True)
class MemoryShares:
    """Shares of the KV-cache capacity, averaged over the saturated steps (they sum to 1 with ``free``)."""

    token_states: float
    reservation: float
    internal: float
    external: float
    free: float
    finished: int
    steps: int
    """Saturated steps sampled."""
    preempted: int = 0
    """Sequences evicted (to be recomputed) because a paged cache had no block for their next token."""


def sample_requests(n: int, mean_prompt: float, mean_output: float, max_len: int, arrivals_per_step: float,
                    seed: int = 0) -> list[Request]:
    """``n`` requests with exponentially distributed prompt and output lengths, capped at ``max_len`` in all.

    Arrivals are a Poisson process of ``arrivals_per_step`` requests per decoding step.
    """
    for name, value in (("n", n), ("max_len", max_len)):
        check_positive_int(name, value)
    for name, value in (("mean_prompt", mean_prompt), ("mean_output", mean_output),
                        ("arrivals_per_step", arrivals_per_step)):
        check_positive(name, value, finite=True)
    rng = np.random.default_rng(seed)
    prompts = np.clip(np.ceil(rng.exponential(mean_prompt, n)), 1, max_len - 1).astype(int)
    outputs = np.clip(np.ceil(rng.exponential(mean_output, n)), 1, max_len - prompts).astype(int)
    arrivals = np.floor(np.cumsum(rng.exponential(1 / arrivals_per_step, n))).astype(int)
    return [Request(int(a), int(p), int(o)) for a, p, o in zip(arrivals, prompts, outputs)]


def _reserve(request: Request, policy: str, max_len: int) -> int:
    if policy == "max":
        return max_len
    if policy == "pow2":  # the output rounded up to a power of two (section 6.1: 25 -> 32)
        return min(max_len, request.prompt_len + (1 << math.ceil(math.log2(request.output_len))))
    return request.final_len


def _first_fit(gaps: list[tuple[int, int]], size: int) -> int | None:
    for start, length in gaps:
        if length >= size:
            return start
    return None


def _buddy_fit(gaps: list[tuple[int, int]], size: int) -> int | None:
    """First aligned place for a buddy block of ``size`` (a power of two): a start that is a multiple of ``size``."""
    for start, length in gaps:
        aligned = -(-start // size) * size
        if aligned + size <= start + length:
            return aligned
    return None


def _window_blocks(length: int, window: int | None, block_size: int) -> int:
    """Blocks a sequence of ``length`` tokens must hold when only its last ``window`` tokens are kept.

    The tokens kept are positions ``max(0, length - W) .. length - 1``; the
    blocks before the first of them can be returned to the pool (a paged
    rolling buffer, as for Mistral's sliding window, arXiv:2310.06825).
    """
    if length == 0:
        return 0
    first = 0 if window is None else max(0, length - window)
    return (length - 1) // block_size - first // block_size + 1


def _gaps(capacity: int, used: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Free (start, length) runs of an address space of ``capacity`` slots, given the used runs."""
    gaps, cursor = [], 0
    for start, length in sorted(used):
        if start > cursor:
            gaps.append((cursor, start - cursor))
        cursor = start + length
    if cursor < capacity:
        gaps.append((cursor, capacity - cursor))
    return gaps


def simulate(requests: list[Request], policy: str, capacity_tokens: int, max_len: int = 2048,
             block_size: int = 16, allocator: str = "buddy", sliding_window: int | None = None) -> MemoryShares:
    """Serve ``requests`` first come, first served, one token per running request per step.

    The cache holds ``capacity_tokens`` token slots. A request is admitted
    when its memory can be found: a contiguous run of its reservation, or
    (``"paged"``) the blocks for its prompt and first output token. Memory is
    sampled at every step at which some request is waiting for memory (the
    server is saturated, as in the paper's measurements), and the shares are
    averaged over those steps; with no such step they are all 0. Contiguous
    reservations are placed by ``allocator``: ``"buddy"`` (the paper's Orca,
    section 6.1) or ``"first_fit"``.

    With a ``sliding_window`` ``W`` (Mistral 7B, arXiv:2310.06825, section 2)
    a sequence keeps only its last ``W`` tokens: a contiguous server reserves
    a rolling buffer of at most ``W`` slots, and a paged one returns every
    block that has slid out of the window to the pool.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    check_positive_int("capacity_tokens", capacity_tokens)
    check_positive_int("max_len", max_len)
    check_positive_int("block_size", block_size)
    if any(r.final_len > max_len for r in requests):
        raise ValueError(f"every request must fit in max_len = {max_len} tokens (prompt + output)")
    if policy != "paged" and max_len > capacity_tokens:
        raise ValueError(f"capacity_tokens ({capacity_tokens}) must hold one max_len ({max_len}) reservation")
    if sliding_window is not None:
        check_positive_int("sliding_window", sliding_window)
    keep = (lambda n: n) if sliding_window is None else (lambda n: min(n, sliding_window))
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {ALLOCATORS}, got {allocator!r}")
    pending = sorted(requests, key=lambda r: r.arrival)
    waiting: list[Request] = []
    # admission number -> [request, tokens so far, start slot, reserved slots or blocks held, slots placed]
    running: dict[int, list] = {}
    free_blocks = capacity_tokens // block_size
    totals = np.zeros(5)
    steps = finished = step = preempted = admitted = 0
    while pending or waiting or running:
        while pending and pending[0].arrival <= step:
            waiting.append(pending.pop(0))
        for key in list(running):  # decode: one more token for every running request
            if key not in running:
                continue  # preempted earlier in this step
            entry = running[key]
            if policy == "paged" and sliding_window is not None:
                drop = entry[3] - _window_blocks(entry[1], sliding_window, block_size)
                free_blocks, entry[3] = free_blocks + drop, entry[3] - drop  # blocks that slid out of the window
            if policy == "paged" and _window_blocks(entry[1] + 1, sliding_window, block_size) > entry[3]:
                if free_blocks == 0:  # preempt the latest admitted request, as vLLM does (section 4.5)
                    victim = next(reversed(running))
                    victim_entry = running.pop(victim)
                    free_blocks += victim_entry[3]
                    waiting.insert(0, victim_entry[0])
                    preempted += 1
                    if victim == key:
                        continue
                free_blocks -= 1
                entry[3] += 1
            entry[1] += 1
            if entry[1] >= entry[0].final_len:
                free_blocks += entry[3] if policy == "paged" else 0
                del running[key]
                finished += 1
        while waiting:  # admit in arrival order until the head does not fit; prefill makes its first token
            request = waiting[0]
            first = request.prompt_len + 1
            if policy == "paged":
                need = _window_blocks(first, sliding_window, block_size)
                if need > free_blocks:
                    break
                free_blocks -= need
                running[admitted] = [request, first, None, need]
            else:
                size = keep(_reserve(request, policy, max_len))
                gaps = _gaps(capacity_tokens, [(v[2], v[4]) for v in running.values()])
                if allocator == "buddy":
                    slab = 1 << math.ceil(math.log2(size))
                    start = _buddy_fit(gaps, slab)
                else:
                    slab, start = size, _first_fit(gaps, size)
                if start is None:
                    break
                running[admitted] = [request, first, start, size, slab]
            waiting.pop(0)
            admitted += 1
            if first >= request.final_len:  # a one-token answer is done at prefill
                entry = running.popitem()[1]
                free_blocks += entry[3] if policy == "paged" else 0
                finished += 1
        step += 1
        if not waiting:  # sample only a saturated server: some request is waiting for memory
            continue
        tokens = sum(keep(v[1]) for v in running.values())
        if policy == "paged":
            allocated = block_size * sum(v[3] for v in running.values())
            reservation, internal, external = 0, allocated - tokens, 0
        else:
            allocated = sum(v[3] for v in running.values())
            reservation = sum(min(v[3], keep(v[0].final_len)) - keep(v[1]) for v in running.values())
            internal, external = allocated - tokens - reservation, capacity_tokens - allocated
        free = capacity_tokens - tokens - reservation - internal - external
        totals += np.array([tokens, reservation, internal, external, free]) / capacity_tokens
        steps += 1
    shares = totals / max(steps, 1)
    return MemoryShares(*map(float, shares), finished=finished, steps=steps, preempted=preempted)
