"""Checks that say what is wrong: ``torch.testing.assert_close`` with a hint for the reader of a lab.

:func:`assert_close` takes the same arguments as ``torch.testing.assert_close``
and passes exactly when it passes (it calls it), so swapping one for the other
in a lab's check cell changes nothing for a right answer. For a wrong answer it
raises :class:`CheckFailed`, whose message starts with a hint: which element
differs, by how much, and what that pattern usually means, e.g. ::

    element [3, 17] is 0.0412, expected 0.0823 (off by -0.0411); 8,190 of 8,192 elements
    (100.0%) differ beyond rtol=1.3e-06, atol=1e-05.
    Hint: each row is off by its own factor (here 0.5004): did you forget to divide by the row sum?

The pattern is found by :func:`diagnose` from the two tensors alone (a constant
ratio, a ratio per row, a flipped sign, all zeros, NaN, only the tail wrong, a
transpose, a wrong shape). What a pattern usually means depends on the lab:
:data:`MISTAKES` holds, per lab, the usual cause of each pattern, and a check
names its lab with ``lab=`` (the generic meaning is used otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

GENERIC = {
    "none": "the function returned None: is it written yet, and does it end with `return`?",
    "shape": "a wrong shape: check the output's allocation and any view, reshape or transpose.",
    "transposed": "the result is the transpose of the expected one: swapped indices or strides?",
    "nan": "NaN or inf where a finite number is expected: an overflow (exp of a large number?) or 0 / 0.",
    "zeros": "your result is all zeros: was anything written (stored, returned, accumulated) at all?",
    "sign": "the sign is flipped: a subtraction the wrong way round, or a missing minus?",
    "scaled": "a missing or extra scale factor: a mean instead of a sum, a missing divide, gamma or 1/sqrt(d)?",
    "row_scaled": "each row is off by its own factor: a missing normalisation per row?",
    "tail": "only the last elements differ: the boundary (the last, partial block, its mask) needs care.",
    "some": "only some elements differ: an indexing, masking or off-by-one mistake near those elements?",
}
"""What each pattern of :func:`diagnose` usually means, in any lab."""

MISTAKES: dict[str, dict[str, str]] = {
    "fused-softmax": {
        "row_scaled": "did you forget to divide by the row sum?",
        "nan": "did you subtract the row maximum before exp? exp(x) overflows for large x.",
        "tail": "pad the lanes past n_cols with -inf (not 0) before the max and the sum, and mask the store.",
    },
    "tiled-matmul": {
        "tail": "the edges: mask the loads of A and B past M, N and K with other=0, and mask the store.",
        "scaled": "is the K loop covering all of K (range(0, tl.cdiv(K, BLOCK_K)))?",
        "transposed": "check which stride goes with which index: stride_bk, stride_bn.",
    },
    "ring-all-reduce": {
        "scaled": "each chunk must be added n - 1 times (reduce-scatter), then sent round n - 1 times (all-gather).",
        "some": "the chunk indices: at step s rank r sends chunk (r - s) mod n and receives chunk (r - s - 1) mod n.",
        "tail": "the last chunk is shorter when the length is not a multiple of n: split with torch.tensor_split.",
    },
    "ddp": {
        "scaled": "average, not sum: divide the all-reduced gradient by the world size.",
        "some": "every parameter's gradient must be reduced, each exactly once, before the optimizer step.",
    },
    "zero": {
        "scaled": "average the gradient: reduce-scatter, then divide by the world size.",
        "some": "each rank updates only its own slice, then the slices are all-gathered into every parameter.",
    },
    "tensor-parallel": {
        "scaled": "a missing or extra all-reduce: f reduces in backward, g in forward (off by a factor t).",
        "some": "slice by rank: column-parallel splits the output rows of W, row-parallel its input columns.",
    },
    "pipeline": {
        "scaled": "each micro-batch's loss is divided by m, so the gradients sum to the full batch's mean.",
        "some": "a stage must receive its input (or its output's gradient) before it runs that micro-batch.",
    },
    "profile-find-fix": {
        "some": "the fast step must compute what the slow one does: the mean cross-entropy over the real tokens "
                "(ignore_index=ss.IGNORE, not a mean over every position), the clip factor "
                "min(1, MAX_NORM / (norm + 1e-6)), then AdamW at lr 1e-3.",
        "scaled": "every weight off by about one factor: the update's size differs, so the clip (MAX_NORM, the "
                  "factor min(1, ...)) or AdamW's learning rate (1e-3) is not the slow step's.",
    },
    "fused-linear-cross-entropy": {
        "scaled": "the gradient of the mean loss is (softmax - one_hot) / N: multiply by inv_n in the kernel's second "
                  "sweep, and divide the summed row losses by N.",
        "row_scaled": "each row off by its own factor: the softmax is exp(z - lse) with lse = m + log(s) from the "
                      "first sweep; is s rescaled by exp(m - m_new) whenever the running maximum grows?",
        "nan": "an overflow: subtract the running maximum before exp, and rescale the running sum by exp(m - m_new) "
               "when the maximum grows (other=-inf for the masked lanes, so they add exp(-inf) = 0).",
        "tail": "the last, partial block: load past n_cols with other=-inf for the max and the sum (0 would add "
                "exp(0 - m) terms), and mask the store.",
        "some": "the target's logit: read z[target] before the second sweep overwrites the row, and subtract the "
                "one-hot only at column target; in the chunk loop, rows start:stop of hidden, targets and the loss.",
    },
    "crash-and-resume": {
        "some": "a resumed run that drifts from the uninterrupted one: did the checkpoint hold the optimizer (AdamW's "
                "moments and step counts) and the schedule's position, and did restore put both back?",
        "scaled": "every weight off by about one factor (RMSNorm's weights sit near 1): the update's size changed, "
                  "so the schedule's position (last_epoch) or the optimizer's state (AdamW's moments and step "
                  "counts) was not restored.",
    },
    "activation-checkpointing": {
        "some": "restore the RNG state before recomputing the forward, so dropout draws the same mask.",
        "zeros": "backward must return the gradients of the inputs (None for run and n_inputs).",
    },
    "loss-scaling": {
        "scaled": "unscale the gradients (divide by the scale) before checking them and stepping.",
        "nan": "on inf or NaN skip the step and halve the scale; never step with such a gradient.",
    },
    # The ring-attention lab checks its configurations in an order that tells the mistakes apart, and names the
    # table of the first stage that fails: the non-causal output needs only the merge ("ring-attention"), the causal
    # contiguous one adds the mask, the causal zig-zag one the chunks' global positions, and the gradients the graph.
    "ring-attention": {
        "some": "the non-causal ring needs only the online-softmax merge: at every block rescale the running l AND "
                "acc of its rows by exp(m_old - m_new) before adding rowsum(exp(S - m_new)) and exp(S - m_new) @ V; "
                "return acc / l; and scale the scores q k^T by 1/sqrt(d), once.",
        "row_scaled": "is l rescaled by exp(m_old - m_new) at every block, like acc, and the output acc / l?",
        "scaled": "the scores are q k^T / sqrt(d): the scale applied once, before the max and the exp?",
    },
    "ring-attention-causal": {
        "some": "the causal mask, by global position: set a score to -inf where key position > query position "
                "(strictly: a query sees its own key); rows are the queries at or after the block's first key, cols "
                "the keys at or before its last query; the block at step t is rank (r - t) mod P's, with its "
                "positions.",
        "nan": "a row whose scores are all -inf gives exp(-inf - (-inf)) = NaN: is a query masked from its own key "
               "(the mask is key > query, not >=), or a row kept that sees no key of the block?",
    },
    "ring-attention-zigzag": {
        "some": "global positions: with zig-zag chunks a rank holds chunks r and 2P - 1 - r, not one slice; take the "
                "queries' and the block's positions from positions(S, rank, P, layout) with the layout passed in, the "
                "block's for its owner (r - t) mod P.",
        "nan": "a zig-zag row that sees no key of a block must not be kept: rows and cols from the global positions "
               "of positions(S, rank, P, layout), for this layout.",
    },
    "ring-attention-gradients": {
        "some": "every output is right but a gradient is not, so autograd misses part of the forward: only the running "
                "max may be detached (it cancels in acc / l); a detach(), .data or .item() on l, acc, the scores or "
                "the shifted K/V cuts the graph. Update the running tensors out of place (index_copy).",
        "scaled": "every output is right but a gradient is off by a factor: is each block's contribution in the graph "
                  "once, and nothing detached but the running max?",
        "row_scaled": "every output is right but a gradient is not: only the running max may be detached; l and "
                      "acc must stay in the graph.",
    },
    "ring-attention-work": {
        "some": "count the rectangle each step computes, len(rows) * len(cols) per (batch, head), and 0 for a block "
                "no row sees; without a mask every block counts n * n.",
    },
    "paged-kv-cache": {
        "some": "a block's slot for token t is t % block_size in block block_table[t // block_size].",
        "row_scaled": "the softmax runs over all the sequence's keys, across its blocks, not per block.",
    },
    "rmsnorm-swiglu-rope": {
        "row_scaled": "the 1/rms factor: the mean of x^2 over the real n_cols (not BLOCK_SIZE), plus eps, then rsqrt.",
        "tail": "mask the lanes past n_cols in the load (other=0) and in the store.",
        "sign": "RoPE: (x0 cos - x1 sin, x0 sin + x1 cos); the sign of the sin term?",
    },
    "flash-attention": {
        "row_scaled": "did you divide the output by the running sum l at the end, and rescale it by exp(m_old - m_new)?",
        "scaled": "the scale 1/sqrt(d) applied once, to the scores?",
        "some": "causal: a query sees keys up to and including its own position, no further.",
    },
    "bellman-backups": {
        "scaled": "is gamma applied (R + gamma * P V), and once only?",
        "some": "the optimality backup takes the max over actions; the policy backup the policy's average.",
    },
    "q-learning-and-reinforce": {
        "some": "Q-learning's target uses max_a Q(s', a); SARSA's the action actually taken next. "
                "Use the same random numbers in the same order as the reference.",
        "sign": "the policy gradient is (onehot(a) - pi(s)) times (G_t - b), not the other way round.",
        "scaled": "the discount gamma^t in front of each term, and the returns-to-go G_t?",
    },
    "post-training-lora": {
        "scaled": "the adapter's scale alpha / rank?",
        "zeros": "B starts at zero, so at step 0 only the base layer contributes: return base(x) + the adapter.",
    },
    "post-training-grpo": {
        "scaled": "the mean over each response's tokens, then over responses; and beta on the KL term only?",
        "sign": "the loss is minus the clipped objective plus beta times the KL.",
    },
    "post-training-dpo": {
        "sign": "the margin is (chosen log-ratio) - (rejected log-ratio), and the loss -log sigmoid(beta * margin).",
        "scaled": "beta multiplies the margin inside the sigmoid.",
    },
    "gqa-decoding": {
        "row_scaled": "the softmax over the keys, after the causal mask and the 1/sqrt(d) scale?",
        "some": "causal with a cache: query i at position start + i sees keys 0 .. start + i.",
    },
    # Part 5 lab 1 compares schedules, not tensors: utils.serving.runtime.scheduler_check finds the first step that differs
    # from the reference's and names the table of the rule such a difference usually breaks.
    "serving-scheduler-order": {
        "some": "running requests first, in the order they were admitted (self.running), each given its tokens; "
                "then the waiting queue from its head (self.waiting[0]); an admitted request leaves the queue and "
                "joins the end of self.running.",
    },
    "serving-scheduler-budget": {
        "some": "the token budget: a request gets n = min(len(request.tokens) - request.num_computed, budget left), "
                "then budget -= n (a decode is 1 token); once the budget is spent, nobody else gets tokens this "
                "step, running or waiting.",
    },
    "serving-scheduler-admission": {
        "some": "admission: none in a step that preempted; the head of the queue is admitted only if "
                "blocks_needed(request, n) <= pool.num_free_blocks for its chunk n; if it does not fit, stop "
                "(break): nobody behind it jumps ahead.",
    },
    "serving-scheduler-max-seqs": {
        "some": "at most max_num_seqs requests run at once: stop admitting when len(self.running) reaches "
                "self.max_num_seqs (None means no limit).",
    },
    "serving-scheduler-preemption": {
        "some": "when a running request's blocks are not free, preempt self.running[-1], the last admitted, with "
                "self.preempt(...), and repeat until they are free or the request has preempted itself; a "
                "preempted request gets no tokens this step, and nobody is admitted in a step that preempted.",
    },
    "serving-scheduler-blocks": {
        "some": "blocks: before returning a chunk, append pool.allocate(blocks_needed(request, n)) to "
                "request.blocks, exactly that many; finish() and preempt() give blocks back, and a queued request "
                "that did not fit holds none.",
    },
    "serving-prefix-lookup": {
        "some": "schedule() calls self.take_cached_prefix(request) for the head of the queue before computing its "
                "chunk n, which the hit shortens; take_cached_prefix hashes the usable full blocks, keeps "
                "pool.lookup's hits as request.blocks and their hashes as request.hashes, sets num_computed and "
                "adds it to request.cached_tokens.",
    },
    "serving-prefix-last-token": {
        "some": "leave the last token uncomputed: hash only (len(tokens) - 1) // block_size blocks, so a prompt "
                "that is whole in the cache (72 tokens, 9 full blocks of 8) takes 8 blocks from it and computes "
                "the last 8 tokens: the model must run on the last one for its logits.",
    },
    "serving-prefix-release": {
        "some": "a queued request that does not fit gives back the cache hits take_cached_prefix took: call "
                "self.release_cached_prefix(request) before you stop admitting. Held hits stay counted as in use "
                "(the next step's lookup takes them again), and a small pool runs dry: a deadlock.",
    },
    # Part 5 lab 2, speculative decoding: tokens are compared with assert_same_tokens (no ratios on token ids).
    "speculative-accept": {
        "shape": "stop at the first rejection, right after its one residual sample; append the bonus token from "
                 "p[k] only when all k guesses are kept: 1 to k + 1 tokens.",
        "tail": "the kept guesses agree, the last token does not: at a rejection sample norm(max(0, p_i - q_i)) "
                "(not p_i or q_i); after k kept guesses sample p[k]; each with torch.multinomial(probs, 1, "
                "generator=generator).",
        "some": "keep x_i when r < p_i(x_i) / q_i(x_i), one r = torch.rand((), generator=generator, "
                "dtype=torch.float64) per checked guess, drawn before anything else in its step: the same random "
                "numbers in the same order as the reference.",
    },
    "speculative-loop": {
        "shape": "each step drafts k_step = min(k, len(prompt) + n_new - len(seq) - 1) tokens, so the output "
                 "ends at exactly n_new new tokens.",
        "some": "a token differs from the target's greedy one: feed the target, in one call, seq[cached:] + "
                "proposal and take p from its last k_step + 1 rows; after each step roll both caches back to "
                "len(seq) - 1 tokens, or a rejected guess's keys and values stay and change every later token.",
    },
    "speculative-loop-kept": {
        "some": "accepted holds, per step, the draft tokens kept: len(emitted) - 1, since the last token emitted "
                "is the correction or the bonus, never a kept guess.",
    },
    "speculative-sampling": {
        "some": "the samples do not follow the target: at a rejection the residual max(0, p - q) must be "
                "renormalised, the bonus drawn from p[k], and p, q both at the same temperature (probabilities()).",
    },
    # Part 5 lab 3, decode kernels.
    "decode-merge": {
        "row_scaled": "divide by the sum of the weights exp(lse - max lse) over the splits, per head.",
        "nan": "an empty split has lse = -inf: subtract the largest lse, which is finite, so its weight is "
               "exp(-inf) = 0 (-inf - (-inf) is NaN).",
        "scaled": "the weights are exp(lse_i - max lse), each split's output times its weight, summed over the "
                  "splits (dim -2), divided once by the weights' sum.",
        "some": "weight each split's output by exp(lse_i - max lse) over the splits axis (dim -2 of o_part, -1 of "
                "lse), sum, divide by the weights' sum.",
    },
    "decode-split-kv": {
        "some": "the block table: the j-th block of a sequence is TABLES[seq * s_ts + j], its slot t at block * "
                "s_kb + t * s_ks + kv_head * s_kh; split s covers blocks s * per_split up to min((s + 1) * "
                "per_split, n_blocks), per_split = cdiv(cdiv(length, BLOCK_SIZE), num_splits).",
        "tail": "the last block is partly filled: mask its slots at or past the length (loads other=0, scores "
                "-inf).",
        "nan": "an empty split (the 3-token sequence leaves three of four empty) stores lse = -inf and a finite "
               "output: divide by 1 where l == 0, not 0 / 0.",
        "row_scaled": "the running softmax: at every block rescale l and acc by exp(m_old - m_new); store acc / l and "
                      "lse = m + log(l).",
        "scaled": "the scores are q . k times sm_scale = 1/sqrt(head_dim), applied once.",
        "zeros": "store every head of the group (mask the padded rows) at this split's index of O_PART and LSE.",
    },
    "decode-int4": {
        "scaled": "dequantise (q - z) * s with the group's own scale and zero (group k0 // GROUP_SIZE), and add "
                  "both nibbles' products.",
        "some": "byte j holds column 2j in its low 4 bits (packed & 0xF) and column 2j + 1 in its high 4 bits "
                "(packed >> 4): multiply them by x[2j] and x[2j + 1].",
        "tail": "mask the output rows past N (offs_n < N) in the loads of Q, S, Z and in the store.",
        "zeros": "store the BLOCK_N outputs of the row: tl.store(Y + row * s_ym + offs_n, acc, mask=offs_n < N).",
    },
    # Part 5 lab 4, quantise and serve.
    "quantise-groups": {
        "scaled": "the scale per group: s = (max(w_g, 0) - min(w_g, 0)) / (2^bits - 1), the range widened to "
                  "include 0 (1 where it is 0).",
        "some": "per group of group_size consecutive columns of a row: s = (max(w_g, 0) - min(w_g, 0)) / (2^bits - "
                "1), z = round(-min(w_g, 0) / s), q = clamp(round(w / s) + z, 0, 2^bits - 1).",
        "shape": "scales and zero points are (out_features, in_features // group_size); the levels the shape of "
                 "w, unpacked.",
    },
    "quantise-dequant": {
        "some": "dequantise (q - z) * s, subtracting the zero point before scaling, each group of group_size "
                "columns with its own s and z: reshape(out, in // group_size, group_size), then back.",
        "row_scaled": "each group has its own s and z, not one per row: reshape(out, in // group_size, group_size).",
    },
    "quantise-pack": {
        "some": "two levels per byte, low nibble first: q[:, 0::2] | (q[:, 1::2] << 4).",
    },
    "quantise-kv-vectors": {
        "scaled": "one scale per (token, head) vector: its largest |x| over head_dim, divided by 127 (1 for an "
                  "all-zero vector).",
        "some": "one scale per (token, head) vector, the largest |x| over the last axis only (amax(-1)) / 127; "
                "levels round(x / scale) clamped to [-127, 127], as int8.",
    },
    "quantise-kv-cache": {
        "row_scaled": "read dequantises each vector with its own scale: data.float() * scale[..., None].",
        "some": "write each token's levels and scales at its slot, data[layer].flatten(0, 1)[slots] = q (a view "
                "of the cache, written in place), and read them from the same slots.",
        "zeros": "nothing was written: assign into self.k[layer] and self.v[layer] in place (flatten(0, 1) is a "
                 "view), not into a copy.",
    },
    # Part 2c lab 09, mixture of experts and expert parallelism.
    "moe-route": {
        "row_scaled": "renormalise: divide each token's k weights by their sum (the softmax over all E experts "
                      "comes first, then the top k).",
        "some": "the softmax over the experts (dim -1), then topk: the k largest probabilities in decreasing order, "
                "with their experts.",
    },
    "moe-loss": {
        "scaled": "L = N * sum_i f_i P_i: f_i is the number of tokens that chose expert i among their k, divided "
                  "by the number of tokens (so sum f = k); P_i the mean probability; N once.",
        "some": "f from every token's k choices (bincount of the chosen experts / tokens), P the mean over tokens of "
                "the softmax, and only P carries the gradient.",
        "zeros": "the gradient must flow through P: compute it from the logits in the graph (no detach, no "
                 "torch.no_grad()); f is a count and may be a constant.",
    },
    "moe-capacity": {
        "some": "GShard's order: every token's first choice, tokens in order, then every token's second choice, "
                "and so on; each assignment takes its expert's next free slot, and -1 once the expert has C.",
    },
    "moe-layer": {
        "some": "per group: route, the capacity for the group's tokens, the slots; each kept assignment (slot >= "
                "0) adds weight * expert(x) to its token's output, a dropped one nothing.",
        "scaled": "weight each expert's output by the router weight of that choice, once.",
        "zeros": "a gradient is zero: build y out of place (y = y.index_add(0, rows, values)) so autograd sees it.",
    },
    "moe-all-to-all": {
        "some": "forward: all_to_all_single(out, x, output_split_sizes=recv_counts, input_split_sizes=send_counts); "
                "backward: the same with the two lists swapped, so each row's gradient goes back where it came "
                "from.",
        "shape": "out has sum(recv_counts) rows in forward and sum(send_counts) in backward.",
    },
    "moe-expert-parallel": {
        "some": "sort the kept assignments by expert (then slot), count them per expert, exchange the counts, "
                "dispatch one chunk per destination rank; the combine returns the rows in the order they were "
                "sent, and y[token] += weight * row.",
        "scaled": "weight each returned row by its router weight once; the router's gradient is each rank's part, "
                  "summed over the ranks.",
        "zeros": "the gradient must reach every rank's inputs: dispatch and combine are AllToAll.apply, in the "
                 "graph.",
    },
}
"""Per lab, the usual cause of each pattern of :func:`diagnose`: the common mistakes of that lab."""


SEEN = {
    "none": "nothing came back",
    "shape": "the shapes differ",
    "transposed": "it is the transpose of the expected result",
    "nan": "NaN or inf appears",
    "zeros": "it is all zeros",
    "sign": "it is minus the expected result",
    "scaled": "every differing element is off by the same factor",
    "row_scaled": "each row is off by its own factor",
    "tail": "only the last elements differ",
    "some": "only some elements differ",
}
"""How each pattern of :func:`diagnose` shows, said before a lab's meaning of it."""


def _factor_words(ratio: float) -> str:
    """'about half', 'about twice', ... for a ratio actual / expected."""
    for value, words in ((0.5, "about half"), (2.0, "about twice"), (0.25, "about a quarter"), (4.0, "about four times")):
        if abs(ratio - value) <= 0.02 * value:
            return words
    return f"{ratio:.3g} times"


class CheckFailed(AssertionError):
    """A lab's check failed; ``hint`` is the first line of advice, ``pattern`` the pattern found (or None)."""

    def __init__(self, message: str, hint: str, pattern: str | None) -> None:
        super().__init__(message)
        self.hint = hint
        self.pattern = pattern


def _close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> bool:
    return actual.shape == expected.shape and bool(torch.allclose(actual, expected, rtol=rtol, atol=atol,
                                                                  equal_nan=True))


def _constant(values: torch.Tensor, tolerance: float = 0.02) -> bool:
    """True when ``values`` (a 1-D float tensor, finite) are all within ``tolerance`` of their median, relatively."""
    if values.numel() == 0:
        return False
    median = values.median()
    return bool(median != 0 and ((values - median).abs() <= tolerance * median.abs()).all())


def diagnose(actual: Any, expected: torch.Tensor, rtol: float = 1.3e-6, atol: float = 1e-5) -> str | None:
    """The pattern by which ``actual`` differs from ``expected``, a key of :data:`GENERIC`, or None if none fits.

    Patterns are tried from the most to the least specific. Both are compared in
    float64 on the CPU; ``rtol``, ``atol`` say when two elements agree.
    """
    if actual is None:
        return "none"
    if not isinstance(expected, torch.Tensor):
        raise ValueError(f"expected must be a tensor, got {type(expected).__name__}")
    if not isinstance(actual, torch.Tensor):
        return None
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    if a.shape != e.shape:
        if a.dim() == 2 and a.shape == e.shape[::-1] and _close(a.t(), e, rtol, atol):
            return "transposed"
        return "shape"
    if e.dim() >= 2 and e.shape[-1] == e.shape[-2] and not _close(a, e, rtol, atol) \
            and _close(a.transpose(-1, -2), e, rtol, atol):
        return "transposed"
    if bool((~torch.isfinite(a) & torch.isfinite(e)).any()):
        return "nan"
    if bool((a == 0).all()) and bool((e != 0).any()):
        return "zeros"
    if _close(-a, e, rtol, atol):
        return "sign"
    if e.numel() == 1:
        return None  # one number: no pattern to read, only how far off it is
    differs = ~torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    usable = differs & (e.abs() > atol)
    if bool(usable.any()):
        ratio = a[usable] / e[usable]
        if bool(torch.isfinite(ratio).all()) and _constant(ratio) and usable.sum() >= 2:
            return "scaled"
    if e.dim() >= 2 and bool(torch.isfinite(a).all()):
        rows = e.reshape(-1, e.shape[-1])
        ratios = a.reshape(-1, e.shape[-1]) / rows
        nonzero = rows.abs() > atol
        wrong_rows = differs.reshape(-1, e.shape[-1]).any(-1)
        if bool(wrong_rows.any()) and all(_constant(ratios[i][nonzero[i]]) for i in range(rows.shape[0])
                                          if wrong_rows[i]):
            return "row_scaled"
    flat = differs.flatten()
    first = int(flat.nonzero()[0])
    if first > 0 and bool(flat[first:].all()) and flat.numel() - first < flat.numel() / 2:
        return "tail"
    return "some"


def _describe(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> str:
    """Which element differs first, by how much, and how many differ."""
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    differs = ~torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    n = int(differs.sum())
    if n == 0:
        return f"values agree but the tensors differ in dtype or device ({actual.dtype} on {actual.device}, " \
               f"expected {expected.dtype} on {expected.device})"
    index = tuple(int(i) for i in differs.nonzero()[0])
    got, want = float(a[index]), float(e[index])
    where = "element [" + ", ".join(map(str, index)) + "]" if index else "the value"
    text = f"{where} is {got:.4g}, expected {want:.4g} (off by {got - want:.3g}"
    if want != 0 and got == got:
        text += f", {got / want:.3g} times the expected value"
    return text + f"); {n:,} of {e.numel():,} elements ({100 * n / e.numel():.1f}%) differ beyond " \
                  f"rtol={rtol:.2g}, atol={atol:.2g}."


def _first_mismatch(actual: Any, expected: Any, path: str, rtol: float, atol: float):
    """(path, actual, expected) of the first tensor pair that differs, walking mappings and sequences in order."""
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        for key in expected:
            if key in actual:
                found = _first_mismatch(actual[key], expected[key], f"{path}[{key!r}]", rtol, atol)
                if found:
                    return found
        return None
    if isinstance(expected, Sequence) and not isinstance(expected, str) and isinstance(actual, Sequence):
        for i, (a, e) in enumerate(zip(actual, expected)):
            found = _first_mismatch(a, e, f"{path}[{i}]", rtol, atol)
            if found:
                return found
        return None
    if isinstance(expected, torch.Tensor):
        if actual is None or not isinstance(actual, torch.Tensor) or not _close(actual, expected, rtol, atol):
            return path, actual, expected
    return None


def _default_tolerances(expected: Any) -> tuple[float, float]:
    """torch.testing.assert_close's defaults for the dtype of the first tensor in ``expected``."""
    while isinstance(expected, (Mapping, Sequence)) and not isinstance(expected, (str, torch.Tensor)) and expected:
        expected = next(iter(expected.values())) if isinstance(expected, Mapping) else expected[0]
    dtype = expected.dtype if isinstance(expected, torch.Tensor) else torch.float64
    return {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5)}.get(
        dtype, (1e-7, 1e-7))


def hint_for(actual: Any, expected: Any, rtol: float | None = None, atol: float | None = None,
             lab: str | None = None) -> tuple[str, str | None]:
    """(hint text, pattern) for a failed comparison of ``actual`` with ``expected`` (tensors or nests of them)."""
    if lab is not None and lab not in MISTAKES:
        raise ValueError(f"unknown lab {lab!r}; known: {', '.join(sorted(MISTAKES))}")
    default_rtol, default_atol = _default_tolerances(expected)
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    if actual is None:
        return GENERIC["none"], "none"
    found = _first_mismatch(actual, expected, "", rtol, atol)
    if found is None:
        return "the values agree within the tolerance, so the difference is in dtype, device or structure.", None
    path, a, e = found
    where = f"at {path}: " if path else ""
    pattern = diagnose(a, e, rtol, atol)
    if a is None:
        return where + GENERIC["none"], "none"
    if not isinstance(a, torch.Tensor):
        return f"{where}got a {type(a).__name__}, expected a tensor.", None
    if pattern is None:
        return f"{where}{_describe(a, e, rtol, atol)}", None
    specific = MISTAKES.get(lab, {}).get(pattern)
    seen = SEEN[pattern]
    if pattern == "scaled":
        a64, e64 = a.detach().double().cpu(), e.detach().double().cpu()
        usable = ~torch.isclose(a64, e64, rtol=rtol, atol=atol) & (e64.abs() > atol)
        seen += f", {_factor_words(float((a64[usable] / e64[usable]).median()))} the expected value"
    if pattern == "scaled":
        specific = specific or GENERIC["scaled"]
    if pattern == "some" and not bool(torch.isclose(a.detach().double().cpu(), e.detach().double().cpu(),
                                                    rtol=rtol, atol=atol, equal_nan=True).any()):
        seen = "every element differs, in no simple pattern"  # "some" is only the pattern nothing else fits
        specific = specific or "a mistake in the formula itself, not at a few indices: work one small case by hand?"
    meaning = f"{seen}: {specific}" if specific else GENERIC[pattern]
    return f"{where}{_describe(a, e, rtol, atol)}\nHint: {meaning}", pattern


def assert_close(actual: Any, expected: Any, *, rtol: float | None = None, atol: float | None = None,
                 lab: str | None = None, **kwargs: Any) -> None:
    """``torch.testing.assert_close(actual, expected, rtol=, atol=, **kwargs)``, raising :class:`CheckFailed` with a hint.

    Passes exactly when ``torch.testing.assert_close`` passes. ``lab`` names the
    lab whose table of common mistakes (:data:`MISTAKES`) explains the pattern.
    """
    if lab is not None and lab not in MISTAKES:
        raise ValueError(f"unknown lab {lab!r}; known: {', '.join(sorted(MISTAKES))}")
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, **kwargs)
    except (AssertionError, TypeError, ValueError) as error:
        if isinstance(error, (TypeError, ValueError)) and actual is not None:
            raise
        hint, pattern = hint_for(actual, expected, rtol, atol, lab)
        raise CheckFailed(f"{hint}\n\n{error}", hint, pattern) from None


TOKENS_SEEN = {
    "none": "nothing came back",
    "shape": "one sequence is the other cut short: a different number of tokens",
    "tail": "only the last token differs",
    "some": "the sequences part at a token before the last",
}
"""How a pattern of :func:`assert_same_tokens` shows: token ids are labels, not numbers, so no ratio is read."""


def _tokens(n: int) -> str:
    return f"{n} token" + ("" if n == 1 else "s")


def assert_same_tokens(actual: Any, expected: Any, *, lab: str | None = None, msg: str | None = None) -> None:
    """Two token sequences (lists or 1-D integer tensors) must be equal, else :class:`CheckFailed` at the first split.

    The pattern is ``"shape"`` when one is a prefix of the other, ``"tail"`` when only the last token differs,
    ``"some"`` when they part earlier (``"none"`` for None); ``MISTAKES[lab]`` says what it usually means, its
    ``"some"`` entry standing in for a pattern it does not list. ``msg`` starts the message (which check).
    """
    if lab is not None and lab not in MISTAKES:
        raise ValueError(f"unknown lab {lab!r}; known: {', '.join(sorted(MISTAKES))}")
    want = [int(t) for t in (expected.tolist() if isinstance(expected, torch.Tensor) else expected)]
    got = None if actual is None else [int(t) for t in (actual.tolist() if isinstance(actual, torch.Tensor)
                                                         else actual)]
    if got == want:
        return
    where = f"{msg}: " if msg else ""
    if got is None:
        pattern, text = "none", "got None"
    else:
        first = next((i for i, (a, e) in enumerate(zip(got, want)) if a != e), min(len(got), len(want)))
        pattern = "shape" if first == min(len(got), len(want)) else \
            "tail" if first == len(want) - 1 and len(got) == len(want) else "some"
        if pattern != "shape":
            text = f"token {first} is {got[first]}, expected {want[first]} ({_tokens(len(got))}, expected {len(want)})"
        elif len(got) < len(want):
            text = f"yours stops after {_tokens(len(got))}, the expected goes on to {len(want)}"
        else:
            text = f"yours goes on past the expected {_tokens(len(want))}, to {len(got)}"
    table = MISTAKES.get(lab, {})
    meaning = table.get(pattern) or table.get("some")
    hint = f"{TOKENS_SEEN[pattern]}: {meaning}" if meaning else TOKENS_SEEN[pattern] + "."
    raise CheckFailed(f"{where}{text}\nHint: {hint}", hint, pattern)
