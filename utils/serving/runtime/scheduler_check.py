"""Part 5 lab 1's check: a reader's scheduler against the reference, step by step, with a hint at the first difference.

The lab asks its reader to write the scheduler of :mod:`utils.serving.runtime.scheduler`. Its check cells call
:func:`check_scheduler`, so the reference class is imported here and never into the lab's namespace, where
``Scheduler.schedule??`` would show the answer.

Two engines serve the same requests, one with the reader's scheduler and one with the reference, one step at a
time. Each time the reader's ``schedule()`` returns, before the model runs, its chunks are checked for what
every schedule must satisfy (at least one token per chunk, its blocks allocated, the budget, ``max_num_seqs``, no
blocks held by a queued request, every admitted request first offered to the reader's ``take_cached_prefix``) and
then compared with the reference's chunks of the same step. The first difference raises
:class:`utils.hints.CheckFailed`, which names the step, the queues before it, both schedules, and the rule of the
lab that such a difference usually breaks (the ``serving-scheduler-*`` and ``serving-prefix-*`` tables of
:data:`utils.hints.MISTAKES`). Comparing step by step also bounds the run: a scheduler that stalls, or holds
blocks until the pool runs dry, fails at its first step that the reference does not take, instead of hanging or
crashing inside the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from utils.attention.llama import TinyLlama
from utils.hints import MISTAKES, CheckFailed
from utils.serving.runtime.engine import Engine, EngineStats, chunk_phase

__all__ = ["check_scheduler", "engine_with"]

Chunk = tuple[int, int, str, int]
"""One chunk as compared: (request id, tokens, "prefill" or "decode", position of its first token)."""


def engine_with(model: TinyLlama, scheduler_cls: type | None, num_blocks: int = 256, block_size: int = 8,
                budget: int = 256, *, max_num_seqs: int | None = None, prefix_caching: bool = False) -> Engine:
    """An :class:`Engine` whose scheduler is ``scheduler_cls(pool, block_size, budget, max_num_seqs)``.

    ``scheduler_cls=None`` keeps the engine's own, the reference.
    """
    engine = Engine(model, num_blocks, block_size, budget, prefix_caching, max_num_seqs=max_num_seqs)
    if scheduler_cls is not None:
        engine.scheduler = scheduler_cls(engine.pool, block_size, budget, max_num_seqs)
    return engine


def _hint(rule: str) -> str:
    return MISTAKES[rule]["some"]


def _fail(case: str, step: int, what: str, rule: str, context: str = "") -> CheckFailed:
    hint = _hint(rule)
    return CheckFailed(f"{case}: step {step}: {what}\n{context}Hint: {hint}", hint, "some")


def _ids_of(ids: Sequence[int], limit: int = 8) -> str:
    if not ids:
        return "none"
    words = [f"r{i}" for i in ids]
    return " ".join(words[:limit]) + (f" and {len(words) - limit} more" if len(words) > limit else "")


def _ids(requests: Sequence, limit: int = 8) -> str:
    return _ids_of([r.request_id for r in requests], limit)


def _queues(scheduler) -> str:
    pool = scheduler.pool
    return (f"running {_ids(scheduler.running)}; waiting {_ids(list(scheduler.waiting))}; "
            f"{pool.num_free_blocks} of {pool.num_blocks} blocks free")


def _show(chunks: Sequence[Chunk], preempted: Sequence[int]) -> str:
    parts = [f"r{i} decode" if phase == "decode" else f"r{i} tokens {start}..{start + n - 1}"
             for i, n, phase, start in chunks]
    if len(parts) > 10:
        parts = parts[:10] + [f"and {len(parts) - 10} more"]
    text = ", ".join(parts) if parts else "nothing"
    return text + (f"; preempted {' '.join(f'r{i}' for i in preempted)}" if preempted else "")


@dataclass(frozen=True)
class _Step:
    """What one scheduler did in one step: its chunks, whom it preempted, its queues before and after."""

    chunks: tuple[Chunk, ...]
    preempted: tuple[int, ...]
    before: str
    running_before: frozenset[int]
    after: tuple


def _state(scheduler) -> tuple:
    return (tuple(r.request_id for r in scheduler.running), tuple(r.request_id for r in scheduler.waiting),
            scheduler.pool.num_free_blocks)


def _as_chunks(chunks) -> tuple[Chunk, ...]:
    return tuple((c.request.request_id, c.num_tokens, chunk_phase(c), c.request.num_computed) for c in chunks)


def _invariants(case: str, step: int, scheduler, chunks, context: str) -> None:
    """Raise at the first rule that any schedule must keep, whatever the reference does."""
    if chunks is None:
        raise CheckFailed(f"{case}: step {step}: schedule() returned None.\nHint: it must return the list of "
                          "ScheduledChunk(request, num_tokens) it chose, an empty list if nothing runs.",
                          "return the list of chunks", "none")
    if not all(hasattr(c, "request") and hasattr(c, "num_tokens") for c in chunks):
        raise CheckFailed(f"{case}: step {step}: schedule() returned {chunks!r:.200}.\nHint: return a list of "
                          "ScheduledChunk(request, num_tokens).", "return ScheduledChunk objects", None)
    block_size, caching = scheduler.block_size, scheduler.pool.prefix_caching
    for c in chunks:
        r = c.request
        if r not in scheduler.running:
            raise _fail(case, step, f"r{r.request_id} has a chunk in this step but is not running (preempted in "
                        "this step, or never admitted).", "serving-scheduler-preemption", context)
        if c.num_tokens < 1:
            if caching and r.num_computed >= r.num_tokens:
                raise _fail(case, step, f"r{r.request_id} was scheduled with {c.num_tokens} tokens: all "
                            f"{r.num_tokens} of its tokens were taken from the cache, so the model has no token "
                            "to run for its logits.", "serving-prefix-last-token", context)
            raise _fail(case, step, f"r{r.request_id} was scheduled with {c.num_tokens} tokens; a chunk has at "
                        "least one.", "serving-scheduler-budget", context)
        if len(r.blocks) * block_size < r.num_computed + c.num_tokens:
            raise _fail(case, step, f"r{r.request_id} runs tokens {r.num_computed}..{r.num_computed + c.num_tokens - 1}"
                        f" but holds {len(r.blocks)} blocks of {block_size}, room for "
                        f"{len(r.blocks) * block_size} tokens.", "serving-scheduler-blocks", context)
    for r in scheduler.waiting:
        if r.blocks or r.num_computed:
            rule = "serving-prefix-release" if caching else "serving-scheduler-blocks"
            raise _fail(case, step, f"r{r.request_id} is still waiting but holds {len(r.blocks)} blocks "
                        f"(num_computed = {r.num_computed}); a queued request holds none.", rule, context)
    limit = scheduler.max_num_seqs
    if limit is not None and len(scheduler.running) > limit:
        raise _fail(case, step, f"{len(scheduler.running)} requests are running "
                    f"({_ids(scheduler.running)}) but max_num_seqs = {limit}.", "serving-scheduler-max-seqs",
                    context)
    total = sum(c.num_tokens for c in chunks)
    if total > scheduler.max_num_batched_tokens:
        raise _fail(case, step, f"the step carries {total} tokens, over the budget of "
                    f"{scheduler.max_num_batched_tokens}.", "serving-scheduler-budget", context)


def _difference(mine: _Step, ref: _Step, running_before: frozenset[int], caching: bool) -> tuple[str, str]:
    """(what differs, the rule it usually breaks) for two different steps."""
    if mine.preempted != ref.preempted:
        if not ref.preempted:
            return f"you preempted {_ids_of(mine.preempted)}; the reference preempted nobody.", \
                "serving-scheduler-preemption"
        if not mine.preempted:
            return f"the reference preempted {_ids_of(ref.preempted)}; you preempted nobody.", \
                "serving-scheduler-preemption"
        return f"you preempted {_ids_of(mine.preempted)}, the reference {_ids_of(ref.preempted)}.", \
            "serving-scheduler-preemption"
    mine_ids, ref_ids = [c[0] for c in mine.chunks], [c[0] for c in ref.chunks]
    if mine_ids == ref_ids:
        for (i, n, _, start), (_, n_ref, _, start_ref) in zip(mine.chunks, ref.chunks):
            if start != start_ref:
                if caching and start < start_ref:
                    return (f"r{i} starts at token {start} in yours; the reference found its first {start_ref} "
                            "tokens in the prefix cache.", "serving-prefix-lookup")
                if caching:
                    return (f"r{i} starts at token {start} in yours, at {start_ref} in the reference's: yours "
                            "took more of it from the cache.", "serving-prefix-last-token")
                return f"r{i} starts at token {start} in yours, at {start_ref} in the reference's.", \
                    "serving-scheduler-preemption"
            if n != n_ref:
                return f"r{i} gets {n} tokens in yours, {n_ref} in the reference's.", "serving-scheduler-budget"
        return "the queues after scheduling differ.", "serving-scheduler-order"
    if set(mine_ids) == set(ref_ids):
        return "the same requests run, in another order.", "serving-scheduler-order"
    extra = [i for i in mine_ids if i not in ref_ids]
    missing = [i for i in ref_ids if i not in mine_ids]
    if extra:
        i = extra[0]
        if ref.preempted and (i not in running_before or i in ref.preempted):
            return (f"you admitted r{i} in a step that preempted; the reference admits nobody then.",
                    "serving-scheduler-admission")
        if i in running_before:
            return (f"you gave running r{i} tokens; the reference gave it none (its budget was spent).",
                    "serving-scheduler-budget")
        return f"you admitted r{i}; the reference did not.", "serving-scheduler-admission"
    i = missing[0]
    if i in running_before:
        return f"running r{i} gets tokens in the reference's step, none in yours.", "serving-scheduler-order"
    start_ref = next(c[3] for c in ref.chunks if c[0] == i)
    if caching and start_ref > 0:
        return (f"the reference admitted r{i} with its first {start_ref} tokens found in the prefix cache, so it "
                "needed fewer blocks; you did not admit it.", "serving-prefix-lookup")
    return f"the reference admitted r{i}; you did not.", "serving-scheduler-admission"


def _after_difference(mine: tuple, ref: tuple, caching: bool, preempted: bool) -> tuple[str, str]:
    """(what differs, rule) when the chunks agree but the queues or free blocks after scheduling do not."""
    (running, waiting, free), (ref_running, ref_waiting, ref_free) = mine, ref
    if running != ref_running:
        return (f"the same chunks, but afterwards yours has running {_ids_of(running)}, the reference "
                f"{_ids_of(ref_running)}.", "serving-scheduler-order")
    if waiting != ref_waiting:
        return (f"the same chunks, but afterwards your queue is {_ids_of(waiting)}, the reference's "
                f"{_ids_of(ref_waiting)}.",
                "serving-scheduler-preemption" if preempted else "serving-scheduler-admission")
    return (f"the same chunks, but afterwards your pool has {free} free blocks, the reference's {ref_free}.",
            "serving-prefix-release" if caching and free < ref_free else "serving-scheduler-blocks")


def check_scheduler(scheduler_cls: type, model: TinyLlama, requests: Sequence[tuple[Sequence[int], int]],
                    expected: Sequence[list[int]], *, case: str, num_blocks: int = 256, block_size: int = 8,
                    budget: int = 256, max_num_seqs: int | None = None,
                    prefix_caching: bool = False) -> tuple[list[list[int]], EngineStats]:
    """Serve ``requests`` (prompt, new tokens) with ``scheduler_cls`` and with the reference, step by step.

    Raises :class:`CheckFailed` at the first step whose schedule breaks a rule or differs from the reference's
    (see the module docstring), at the first request whose tokens differ from ``expected`` (greedy decoding, one
    request at a time), if blocks are left held at the end, or if the prefix cache's hits differ. ``case`` names
    the configuration in the messages. Returns the reader's outputs, in request order, and its engine's stats.
    """
    config = dict(max_num_seqs=max_num_seqs, prefix_caching=prefix_caching)
    ref = engine_with(model, None, num_blocks, block_size, budget, **config)
    mine = engine_with(model, scheduler_cls, num_blocks, block_size, budget, **config)
    ref_ids = [ref.add_request(p, n) for p, n in requests]
    my_ids = [mine.add_request(p, n) for p, n in requests]
    ref_steps: list[_Step] = []

    def step_of(scheduler, schedule) -> tuple[list, _Step | None]:
        before, running = _queues(scheduler), frozenset(r.request_id for r in scheduler.running)
        chunks = schedule()
        if chunks is None or not all(hasattr(c, "request") and hasattr(c, "num_tokens") for c in chunks):
            return chunks, None
        return chunks, _Step(_as_chunks(chunks), tuple(scheduler.preempted_last), before, running,
                             _state(scheduler))

    ref_schedule = ref.scheduler.schedule

    def recorded():
        chunks, step = step_of(ref.scheduler, ref_schedule)
        ref_steps.append(step)
        return chunks

    ref.scheduler.schedule = recorded
    ref_outputs = ref.run()
    user_schedule, finished = mine.scheduler.schedule, _Step((), (), "every request finished", frozenset(), ())
    looked_up: set[int] = set()  # requests the reader's schedule() passed to take_cached_prefix in this step
    lookup = getattr(mine.scheduler, "take_cached_prefix", None)
    if lookup is not None:
        def counted(request):
            looked_up.add(request.request_id)
            return lookup(request)
        mine.scheduler.take_cached_prefix = counted

    def checked():
        n = len(my_steps) + 1
        before = _queues(mine.scheduler)
        looked_up.clear()
        try:
            chunks, got = step_of(mine.scheduler, user_schedule)
        except (NotImplementedError, CheckFailed):
            raise
        except Exception as error:
            what = f"{case}: step {n}: your schedule() raised {type(error).__name__}: {error}\n" \
                   f"  before the step: {before}\n"
            if "cannot allocate" in str(error):
                hint = "allocate only after checking blocks_needed(request, n) <= pool.num_free_blocks; a running " \
                       "request whose blocks are not free preempts, a waiting one is not admitted. " + \
                       _hint("serving-scheduler-preemption")
            else:
                hint = "the traceback above ends at the line of your schedule() that failed."
            raise CheckFailed(f"{what}Hint: {hint}", hint, None) from error
        my_steps.append(got)
        if got is None:
            _invariants(case, n, mine.scheduler, chunks, "")  # not a list of chunks: says so
        want = ref_steps[n - 1] if n <= len(ref_steps) else finished

        def differs(what: str, rule: str) -> CheckFailed:
            return _fail(case, n, what, rule,
                         f"  before the step, yours: {before}\n"
                         f"        the reference's: {want.before}\n"
                         f"  yours ran:      {_show(got.chunks, got.preempted)}\n"
                         f"  reference ran:  {_show(want.chunks, want.preempted)}\n")

        if n <= len(ref_steps) and got.preempted != want.preempted:  # before the rules a wrong victim breaks
            raise differs(*_difference(got, want, want.running_before, prefix_caching))
        _invariants(case, n, mine.scheduler, chunks, f"  before the step: {before}\n")
        admitted = [i for i, *_ in got.chunks if i not in got.running_before]
        if lookup is not None and any(i not in looked_up for i in admitted):
            i = next(i for i in admitted if i not in looked_up)
            raise _fail(case, n, f"you admitted r{i} without calling self.take_cached_prefix for it first (it does "
                        "nothing until step 3, but schedule() must call it then).", "serving-prefix-lookup",
                        f"  before the step: {before}\n")
        if (got.chunks, got.preempted, got.after) == (want.chunks, want.preempted, want.after):
            return chunks
        if n > len(ref_steps):
            raise differs(f"the reference had finished every request after {len(ref_steps)} steps; yours still "
                          "runs.", "serving-scheduler-order" if got.chunks else "serving-scheduler-admission")
        if (got.chunks, got.preempted) == (want.chunks, want.preempted):
            raise differs(*_after_difference(got.after, want.after, prefix_caching, bool(want.preempted)))
        raise differs(*_difference(got, want, want.running_before, prefix_caching))

    my_steps: list[_Step] = []
    mine.scheduler.schedule = checked
    try:
        outputs = mine.run()
    except CheckFailed as failure:  # shown from here: the engine's and this module's frames are no help to a reader
        raise failure.with_traceback(None)
    mine_outputs = [outputs[i] for i in my_ids]
    for i, (got, want) in enumerate(zip(mine_outputs, expected)):
        if got != want:
            first = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            raise CheckFailed(
                f"{case}: r{i}'s output differs from greedy decoding at token {first}: {got[first:first + 4]}..., "
                f"expected {want[first:first + 4]}...\nHint: {_hint('serving-scheduler-blocks')}",
                _hint("serving-scheduler-blocks"), "some")
    assert [ref_outputs[i] for i in ref_ids] == list(expected), "the reference itself disagrees with greedy"
    held = num_blocks - mine.pool.num_free_blocks
    if held:
        raise CheckFailed(f"{case}: every request has finished but {held} of {num_blocks} blocks are still held.\n"
                          f"Hint: {_hint('serving-scheduler-blocks')}", _hint("serving-scheduler-blocks"), "some")
    stats, ref_stats = mine.stats(), ref.stats()
    if stats.prefix_hit_tokens != ref_stats.prefix_hit_tokens:
        raise CheckFailed(f"{case}: {stats.prefix_hit_tokens} prompt tokens were found in the cache with yours, "
                          f"{ref_stats.prefix_hit_tokens} with the reference.\nHint: {_hint('serving-prefix-lookup')}",
                          _hint("serving-prefix-lookup"), "some")
    return mine_outputs, stats
