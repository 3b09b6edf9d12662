"""A radix tree of cached token sequences: SGLang's RadixAttention cache, without the tensors.

Zheng et al. 2024, "SGLang: Efficient Execution of Structured Language Model
Programs" (arXiv:2312.07104), section 3, keep the KV cache of every finished
(and running) request in a radix tree: each edge holds a *run* of tokens, each
node the KV cache of its edge's tokens, and the path from the root to a node
spells the prefix whose keys and values it holds. A new request walks the tree
from the root and reuses the longest prefix it finds, to the token.

What this module does as SGLang's ``RadixCache`` does
(``python/sglang/srt/mem_cache/radix_cache.py``):

- ``match_prefix`` walks down; if the match ends inside an edge, that edge is
  **split** in two at the boundary (``_split_node``), so the matched prefix ends
  on a node. Every node on the path gets a new last-access time.
- ``insert`` walks the same way, splits on a partial match and hangs the
  unmatched rest of the sequence under the last node as one new leaf; it returns
  how many tokens were already there.
- A running request **locks** the node its prefix ends at (``inc_lock_ref``):
  the count goes up on that node and every ancestor, and a node with a nonzero
  count is never evicted. ``unlock`` undoes it (``dec_lock_ref``). A split copies
  the count to the new upper node, so a lock taken before a split still covers
  the whole path.
- Eviction (``evict``) takes the **least recently used unlocked leaf**, deletes
  it whole, and once its parent has become an unlocked leaf the parent joins the
  candidates; it stops when enough tokens are gone (it may free more than asked:
  whole leaves go).

Simplified here: nodes hold no KV indices (only the token count matters for a
hit rate); time is a logical clock (one tick per call) instead of
``time.monotonic()``, with ties broken by node age; only LRU (SGLang also offers
LFU, FIFO, MRU, FILO and priority); page size 1 (SGLang's ``page_size > 1`` matches
whole pages only: :mod:`utils.serving.runtime.block_pool` plays that part here); no
``extra_key`` namespaces (LoRA, cache salt), no host-memory tier (HiRadixCache)
and no KV events. A ``capacity_tokens`` makes :meth:`insert` evict before it adds,
as SGLang's allocator evicts when it runs out of free slots.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from utils.validate import check_nonnegative_int, check_positive_int

__all__ = ["RadixTree", "NodeView"]


class _Node:
    __slots__ = ("id", "tokens", "children", "parent", "lock_ref", "last_access")

    def __init__(self, node_id: int, tokens: tuple[int, ...], parent: _Node | None, now: int) -> None:
        self.id = node_id
        self.tokens = tokens
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = now


@dataclass(frozen=True)
class NodeView:
    """One node of :meth:`RadixTree.nodes`: its edge's tokens, parent id (``None`` for the root), lock, access time."""

    id: int
    parent: int | None
    tokens: tuple[int, ...]
    lock_ref: int
    last_access: int


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _as_tokens(tokens: Sequence[int]) -> tuple[int, ...]:
    try:
        out = tuple(int(t) for t in tokens)
    except (TypeError, ValueError):
        raise ValueError("tokens must be a sequence of integers") from None
    return out


class RadixTree:
    """Cached token sequences in a radix tree, with locks and LRU eviction of unlocked leaves.

    ``capacity_tokens`` (``None``: unbounded) caps the tokens the tree holds; :meth:`insert`
    evicts to stay under it, except what running requests have locked.
    Counters: ``queried_tokens`` and ``hit_tokens`` (over :meth:`match_prefix` calls),
    ``inserted_tokens`` (new tokens stored), ``evicted_tokens``, ``splits``.
    """

    def __init__(self, capacity_tokens: int | None = None) -> None:
        if capacity_tokens is not None:
            check_positive_int("capacity_tokens", capacity_tokens)
        self.capacity_tokens = capacity_tokens
        self._ids = itertools.count()
        self._clock = 0
        self.root = _Node(next(self._ids), (), None, 0)
        self.root.lock_ref = 1  # the root is never evicted, as in SGLang
        self.total_tokens = 0
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.inserted_tokens = 0
        self.evicted_tokens = 0
        self.splits = 0

    @property
    def hit_rate(self) -> float:
        """``hit_tokens / queried_tokens`` over all :meth:`match_prefix` calls (0 before any)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    # --- walking ---------------------------------------------------------------------------------

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _split(self, child: _Node, at: int) -> _Node:
        """Cut ``child``'s edge after ``at`` tokens; the new upper node takes the first part and the lock."""
        upper = _Node(next(self._ids), child.tokens[:at], child.parent, child.last_access)
        upper.lock_ref = child.lock_ref
        upper.children[child.tokens[at]] = child
        child.parent.children[child.tokens[0]] = upper
        child.parent = upper
        child.tokens = child.tokens[at:]
        self.splits += 1
        return upper

    def _walk(self, tokens: tuple[int, ...], now: int) -> tuple[_Node, int]:
        """The node the longest cached prefix of ``tokens`` ends at (splitting an edge if needed), and its length."""
        node, matched = self.root, 0
        node.last_access = now
        while matched < len(tokens) and tokens[matched] in node.children:
            child = node.children[tokens[matched]]
            n = _common_length(child.tokens, tokens[matched:])
            child.last_access = now
            if n < len(child.tokens):
                child = self._split(child, n)
            node, matched = child, matched + n  # after a split the next token has no child: the loop ends
        return node, matched

    # --- public API ------------------------------------------------------------------------------

    def match_prefix(self, tokens: Sequence[int]) -> int:
        """Tokens of the longest prefix of ``tokens`` the tree holds; counts them as queried and hit.

        Touches every node on the path (LRU) and splits an edge the match ends inside (as SGLang does).
        """
        tokens = _as_tokens(tokens)
        _, matched = self._walk(tokens, self._tick())
        self.queried_tokens += len(tokens)
        self.hit_tokens += matched
        return matched

    def insert(self, tokens: Sequence[int]) -> int:
        """Store ``tokens``; returns how many of them were already cached (not counted as a query).

        With a capacity, unlocked least-recently-used leaves are evicted first to make room for the new
        tokens (the matched prefix is held meanwhile, so it is never the victim). If locked tokens leave
        too little room, only what fits is kept: the new tail beyond the capacity is not stored.
        """
        tokens = _as_tokens(tokens)
        now = self._tick()
        node, matched = self._walk(tokens, now)
        rest = tokens[matched:]
        if not rest:
            return matched
        if self.capacity_tokens is not None:
            self._lock_path(node, +1)
            over = self.total_tokens + len(rest) - self.capacity_tokens
            if over > 0:
                self.evict(over)
            self._lock_path(node, -1)
            room = self.capacity_tokens - self.total_tokens
            rest = rest[:max(room, 0)]
            if not rest:
                return matched
        leaf = _Node(next(self._ids), rest, node, now)
        node.children[rest[0]] = leaf
        self.total_tokens += len(rest)
        self.inserted_tokens += len(rest)
        return matched

    def lock(self, tokens: Sequence[int]) -> object:
        """Lock the longest cached prefix of ``tokens`` (a running request's); returns a handle for :meth:`unlock`."""
        node, _ = self._walk(_as_tokens(tokens), self._tick())
        self._lock_path(node, +1)
        return node

    def unlock(self, handle: object) -> None:
        """Release a lock that :meth:`lock` returned."""
        if handle is self.root:  # nothing was cached, nothing was locked
            return
        if not isinstance(handle, _Node) or handle.lock_ref <= 0:
            raise ValueError("unlock needs a handle from lock() that is still locked")
        self._lock_path(handle, -1)

    def _lock_path(self, node: _Node, delta: int) -> None:
        while node is not None and node is not self.root:
            node.lock_ref += delta
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Delete least recently used unlocked leaves until ``num_tokens`` are gone (or none is left).

        Returns the tokens freed: whole leaves go, so it may be more than ``num_tokens``.
        """
        check_nonnegative_int("num_tokens", num_tokens)
        heap = [(n.last_access, n.id, n) for n in self._all_nodes()
                if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.tokens[0]]
            freed += len(leaf.tokens)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        self.total_tokens -= freed
        self.evicted_tokens += freed
        return freed

    def _all_nodes(self) -> list[_Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node is not self.root:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def nodes(self) -> list[NodeView]:
        """Every node but the root, parents before children (for drawing and tests)."""
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node is not self.root:
                out.append(NodeView(node.id, node.parent.id, node.tokens, node.lock_ref, node.last_access))
            stack.extend(sorted(node.children.values(), key=lambda n: n.tokens[0], reverse=True))
        return out

    def sequences(self) -> list[tuple[int, ...]]:
        """The token sequence spelled by each leaf's path: what the tree can match in full."""
        out: list[tuple[int, ...]] = []

        def visit(node: _Node, prefix: tuple[int, ...]) -> None:
            here = prefix + node.tokens
            if not node.children and node is not self.root:
                out.append(here)
            for child in node.children.values():
                visit(child, here)

        visit(self.root, ())
        return out
