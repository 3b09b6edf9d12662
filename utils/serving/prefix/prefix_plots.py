"""Figures of the prefix-caching chapter: hit rate against block size and capacity, and a radix tree at work.

Pure functions of their arguments that return a Matplotlib figure (the
:mod:`utils.viz` pattern), plus :func:`radix_story` (the frames of a small radix
tree serving a few requests) and :func:`radix_animation`, which plays them as a
kernel-free animation whose frame image carries a text description of each frame
as its ``alt`` text.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from utils.serving.prefix.prefix_workloads import WORKLOADS, replay_block_cache, replay_radix_tree
from utils.serving.prefix.radix_tree import NodeView, RadixTree

WORKLOAD_COLORS = {"chat": "tab:blue", "few-shot": "tab:green", "agent": "tab:purple"}


def _requests(workload: str, seed: int):
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
    return WORKLOADS[workload](seed=seed)


def plot_block_size(block_sizes: tuple[int, ...] = (1, 4, 16, 64, 256), seed: int = 0) -> Figure:
    """Hit rate of each workload against block size, with room for everything (no eviction).

    Block size 1 is the radix tree's token granularity: the two caches then find the same prefixes.
    """
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for name in WORKLOADS:
        requests = _requests(name, seed)
        room = sum(len(r.prompt) + len(r.output) for r in requests) + max(block_sizes)
        rates = [100 * replay_block_cache(requests, room, b).hit_rate for b in block_sizes]
        ax.plot(block_sizes, rates, "o-", color=WORKLOAD_COLORS[name], label=name)
        ax.axhline(100 * replay_radix_tree(requests, room).hit_rate, color=WORKLOAD_COLORS[name], ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(block_sizes, [str(b) for b in block_sizes])
    ax.set(xlabel="block size (tokens)", ylabel="prompt tokens served from cache (%)",
           title="Block granularity: the partial tail of every shared run is recomputed\n"
                 "(dotted: radix tree, to the token)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def capacity_curve(workload: str = "chat", block_size: int = 16, seed: int = 0,
                   n_points: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Capacities (tokens, from the longest request to everything) and the hit rates of both caches there."""
    requests = _requests(workload, seed)
    longest = max(len(r.prompt) + len(r.output) for r in requests)
    lo = -(-longest // block_size) * block_size
    hi = sum(len(r.prompt) + len(r.output) for r in requests) + block_size
    capacities = np.unique(np.geomspace(lo, hi, n_points).astype(int) // block_size * block_size)
    capacities = np.maximum(capacities, lo)
    radix = np.array([replay_radix_tree(requests, int(c)).hit_rate for c in capacities])
    block = np.array([replay_block_cache(requests, int(c), block_size).hit_rate for c in capacities])
    return capacities, block, radix


def plot_capacity(workload: str = "chat", block_size: int = 16, seed: int = 0) -> Figure:
    """Hit rate against cache capacity for one workload: block-hash cache and radix tree, both LRU."""
    capacities, block, radix = capacity_curve(workload, block_size, seed)
    requests = _requests(workload, seed)
    total = sum(len(r.prompt) + len(r.output) for r in requests)
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    ax.plot(capacities, 100 * radix, "s-", color="tab:red", label="radix tree (token granularity)")
    ax.plot(capacities, 100 * block, "o-", color="tab:blue", label=f"block hashes, {block_size}-token blocks")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
    ax.set_ylim(0, 100)
    ax.set(xlabel="cache capacity (tokens)", ylabel="prompt tokens served from cache (%)",
           title=f"{workload}: {len(requests)} requests, {total:,} tokens of prompt and output in all")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


# --- a radix tree at work --------------------------------------------------------------------------

WORDS = ("<sys>", "be", "brief", "kind", "|", "hi", "hello", "how", "are", "you", "fine", "2+2?", "4",
         "a", "joke", "no", "ok", "bye")
"""The tiny vocabulary of the story: token id ``i`` is the word ``WORDS[i]``."""


def _ids(text: str) -> tuple[int, ...]:
    return tuple(WORDS.index(w) for w in text.split())


STORY = (
    ("arrive", "A", "<sys> be brief | hi", "hello"),
    ("finish", "A", "", ""),
    ("arrive", "B", "<sys> be brief | hi hello | how are you", "fine"),
    ("arrive", "C", "<sys> be brief | 2+2?", "4"),
    ("finish", "C", "", ""),
    ("finish", "B", "", ""),
    ("arrive", "D", "<sys> be kind | a joke", "no"),
    ("finish", "D", "", ""),
    ("arrive", "E", "<sys> be brief | 2+2? 4 | ok", "bye"),
    ("finish", "E", "", ""),
)
"""Requests A to E: a chat's two turns (A, B), a question under the same system prompt (C), another
system prompt (D) and C's follow-up (E); B runs while C and D come and go."""


@dataclass(frozen=True)
class RadixFrame:
    """One frame: what happened, the tree's nodes, and marks by node id (``hit``, ``new``, ``evict``)."""

    caption: str
    nodes: tuple[NodeView, ...]
    marks: dict[int, str]
    total_tokens: int
    capacity_tokens: int


def _path_ids(nodes: tuple[NodeView, ...], tokens: tuple[int, ...]) -> list[int]:
    """Ids of the nodes on the path that spells the longest cached prefix of ``tokens``."""
    children: dict[int | None, list[NodeView]] = {}
    for n in nodes:
        children.setdefault(n.parent, []).append(n)
    root = min((n.parent for n in nodes if n.parent not in {m.id for m in nodes}), default=None)
    path, parent, i = [], root, 0
    while i < len(tokens):
        nxt = next((c for c in children.get(parent, []) if c.tokens[0] == tokens[i]), None)
        if nxt is None or tuple(tokens[i:i + len(nxt.tokens)]) != nxt.tokens:
            break
        path.append(nxt.id)
        parent, i = nxt.id, i + len(nxt.tokens)
    return path


def radix_story(capacity_tokens: int = 20) -> list[RadixFrame]:
    """Replay :data:`STORY` on a :class:`RadixTree` of ``capacity_tokens`` and record a frame per event.

    Arrival: match the prompt (all but its last token) and lock the matched path. Finish: insert prompt
    and output (LRU leaves evicted first if the capacity is reached, shown in a frame of their own), then
    unlock.
    """
    tree = RadixTree(capacity_tokens)
    frames: list[RadixFrame] = []
    handles, seqs = {}, {}

    def record(caption: str, marks: dict[int, str], nodes=None) -> None:
        frames.append(RadixFrame(caption, tuple(tree.nodes() if nodes is None else nodes), marks,
                                 tree.total_tokens, capacity_tokens))

    record("an empty cache", {})
    for event, name, prompt_text, output_text in STORY:
        if event == "arrive":
            prompt, output = _ids(prompt_text), _ids(output_text)
            seqs[name] = prompt + output
            splits = tree.splits
            hit = tree.match_prefix(prompt[:-1])
            handles[name] = tree.lock(prompt[:-1])
            nodes = tuple(tree.nodes())
            split_note = ", splitting an edge where the match ends" if tree.splits > splits else ""
            record(f"{name} arrives: '{prompt_text}'; {hit} of {len(prompt)} prompt tokens hit{split_note}; "
                   f"its path is locked while it runs", {i: "hit" for i in _path_ids(nodes, prompt[:-1])})
        else:
            before, tokens_before, evicted_before = tuple(tree.nodes()), tree.total_tokens, tree.evicted_tokens
            tree.insert(seqs[name])
            after = tuple(tree.nodes())
            gone = {n.id for n in before} - {n.id for n in after}
            if gone:
                frames.append(RadixFrame(f"{name} finishes: the cache is full, so the least recently used "
                                         f"unlocked leaves go first ({tree.evicted_tokens - evicted_before} "
                                         f"tokens)", before, {i: "evict" for i in gone}, tokens_before,
                                         capacity_tokens))
            new = {n.id for n in after} - {n.id for n in before}
            tree.unlock(handles.pop(name))
            record(f"{name} finishes: its prompt and output are inserted ({len(seqs[name])} tokens, "
                   f"{sum(len(n.tokens) for n in after if n.id in new)} of them new) and its lock released",
                   {i: "new" for i in new})
    return frames


_MARK_STYLE = {"hit": ("#b7e4b0", "tab:green"), "new": ("#ffd8a8", "tab:orange"), "evict": ("#f4b6b6", "tab:red")}


def _layout(nodes: tuple[NodeView, ...]) -> dict[int, tuple[float, float]]:
    children: dict[int | None, list[NodeView]] = {}
    ids = {n.id for n in nodes}
    for n in nodes:
        children.setdefault(n.parent if n.parent in ids else None, []).append(n)
    pos: dict[int, tuple[float, float]] = {}
    next_x = [0.0]

    def place(node: NodeView, depth: int) -> float:
        kids = sorted(children.get(node.id, []), key=lambda c: c.tokens[0])
        if kids:
            x = float(np.mean([place(k, depth + 1) for k in kids]))
        else:
            x, next_x[0] = next_x[0], next_x[0] + 1.0
        pos[node.id] = (x, -depth)
        return x

    for top in sorted(children.get(None, []), key=lambda c: c.tokens[0]):
        place(top, 1)
    return pos


def draw_radix_frame(ax: Axes, frame: RadixFrame) -> None:
    """Draw one :class:`RadixFrame`: nodes as boxes of their edge's words, locks as thick borders."""
    ax.axis("off")
    pos = _layout(frame.nodes)
    xs = [p[0] for p in pos.values()] or [0.0]
    root_x = float(np.mean([pos[n.id][0] for n in frame.nodes if n.parent not in pos])) if frame.nodes else 0.0
    ax.text(root_x, 0, "root", ha="center", va="center", fontsize=8,
            bbox=dict(boxstyle="round", fc="white", ec="0.4"))
    for n in frame.nodes:
        x, y = pos[n.id]
        px, py = pos.get(n.parent, (root_x, 0))
        ax.plot([px, x], [py - 0.12, y + 0.12], color="0.6", lw=1, zorder=0)
    for n in frame.nodes:
        x, y = pos[n.id]
        face, edge = _MARK_STYLE.get(frame.marks.get(n.id, ""), ("white", "0.4"))
        label = " ".join(WORDS[t] for t in n.tokens)
        extra = f"\nlock {n.lock_ref}" if n.lock_ref else ""
        ax.text(x, y, label + extra, ha="center", va="center", fontsize=7.5,
                bbox=dict(boxstyle="round", fc=face, ec=edge if not n.lock_ref else "black",
                          lw=2.4 if n.lock_ref else 1, hatch="//" if frame.marks.get(n.id) == "evict" else None))
    depth = min([p[1] for p in pos.values()] or [0])
    ax.set_xlim(min(xs) - 0.8, max(xs) + 0.8)
    ax.set_ylim(depth - 0.6, 0.5)
    ax.set_title("\n".join(_wrap(frame.caption, 95)), fontsize=8.5)
    ax.text(0.0, -0.02, f"cached: {frame.total_tokens} of {frame.capacity_tokens} tokens   "
            "green: hit   orange: new   red, hatched: evicted   thick border: locked",
            transform=ax.transAxes, fontsize=7, color="0.3", va="top")


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width)


def describe_frame(frame: RadixFrame) -> str:
    """A text description of a frame for its ``alt`` text: the caption and the tree, nested."""
    children: dict[int | None, list[NodeView]] = {}
    ids = {n.id for n in frame.nodes}
    for n in frame.nodes:
        children.setdefault(n.parent if n.parent in ids else None, []).append(n)

    def spell(node: NodeView) -> str:
        mark = frame.marks.get(node.id)
        words = " ".join(WORDS[t] for t in node.tokens)
        tag = f" ({mark})" if mark else ""
        tag += " (locked)" if node.lock_ref else ""
        kids = sorted(children.get(node.id, []), key=lambda c: c.tokens[0])
        return f"[{words}]{tag}" + (" -> {" + "; ".join(spell(k) for k in kids) + "}" if kids else "")

    tops = sorted(children.get(None, []), key=lambda c: c.tokens[0])
    tree = "; ".join(spell(t) for t in tops) or "empty"
    return (f"Radix tree, {frame.total_tokens} of {frame.capacity_tokens} tokens cached. {frame.caption}. "
            f"Tree: root -> {{{tree}}}")


def radix_animation(frames: list[RadixFrame], interval_ms: int = 1800) -> object:
    """The frames as a scrubbable ``FuncAnimation.to_jshtml`` animation (:func:`utils.viz.animate`).

    The frame ``<img>`` gets :func:`describe_frame` of the frame shown as its ``alt`` text, updated as the
    reader scrubs, and the slider a ``<label>``.
    """
    from utils import viz

    if not frames:
        raise ValueError("frames must not be empty")
    return viz.animate(lambda ax, i: draw_radix_frame(ax, frames[i]), len(frames), figsize=(8.0, 3.6),
                       interval_ms=interval_ms, alt=[describe_frame(f) for f in frames],
                       label="Radix tree animation: frame")
