"""A radix tree of token blocks per namespace, with LRU eviction and exact byte accounting.

One node per block. A node's children are keyed by the child block's exact token ids (canonical
uint32 LE bytes), so a lookup succeeds only when every token of every block on the path is equal:
a hit is verified by construction and no hash collision can return another context's KV.

    namespace root ── [ids 0..15] ── [ids 16..31] ── [ids 32..47]      (context A)
                                  └─ [ids 16..31'] ── ...               (context B: differs in block 1)

Each node owns its block's payloads, as extents of the arena (ExtentAllocator):
  global_extent   always present (a node exists only if its global KV is stored)
  local_extent    optional sliding-window-layer KV, evictable on its own before the node

Invariants (checked by `check_invariants`, exercised by the hypothesis tests):
  * used_bytes == bytes of attached nodes' payloads + reserved extents + payloads of detached
    nodes still pinned; used_bytes <= capacity_bytes.
  * Eviction never frees a pinned node's payloads. A node removed while pinned (Drop) is detached
    from the tree at once and its extents are freed when the last pin goes.
  * Recency is a monotonic counter (`_clock`), never wall-clock time. Touching a path stamps it
    from the leaf up, so a parent is newer than its children; the oldest global entry is therefore
    normally a leaf, and eviction (which only removes unpinned leaves) rarely skips anything.
  * Local payloads have their own stamp, refreshed only when they are stored or fetched: local KV
    of old turns ages out while the global KV of the same blocks, touched by every later turn,
    stays. One eviction step removes whichever is older: the LRU unpinned local payload, or the
    LRU unpinned leaf (with its local payload).
Match is a query (no recency change); fetch and put touch what they use.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from salon.common.kvstore_contract.layout import MISS, KVLayout, MatchResult
from salon.kvstore.allocator import Extent, ExtentAllocator, aligned


class LayoutMismatch(ValueError):
    """A request's layout differs from the one its namespace was created with."""


class _Span:
    """A node's payload as an Extent (made on each read), kept in the slot `slot` as an (offset, length) tuple or None:
    where many blocks are read at once, the spans themselves are cheaper."""

    def __init__(self, slot: str) -> None:
        self.slot = slot

    def __get__(self, node: Node | None, owner: type | None = None):
        if node is None:
            return self
        span = getattr(node, self.slot)
        return None if span is None else Extent(*span)

    def __set__(self, node: Node, extent: Extent | None) -> None:
        setattr(node, self.slot, None if extent is None else (extent.offset, extent.length))


class Node:
    """One stored block. A tree holds hundreds of thousands of them, and CPython's full collection walks every
    object it tracks with the GIL held: a node is the one such object of a block (with its parent's children
    dict). Its payloads are kept as plain (offset, length) tuples and its owners in a dict of strings: the
    collector stops tracking those, where it would walk an Extent object or a set for as long as the block
    lives."""

    __slots__ = (
        "key",  # this block's token ids, canonical bytes (b"" for the root)
        "parent",  # Node | None (None for the root)
        "children",  # dict[bytes, Node]: child block token bytes -> child
        "namespace",  # Namespace the node belongs to
        "block_index",  # position of the block in its context (root: -1)
        "global_span",  # (offset, length) of the global payload | None (None only for the root)
        "local_span",  # (offset, length) of the local payload | None
        "pins",  # readers/writers holding this node; > 0 means never evicted or freed
        "owners",  # dict[str, None]: conversations that put this block (for Drop by conversation)
        "global_stamp",  # _clock value of the last touch of the node
        "local_stamp",  # _clock value of the last touch of the local payload
        "detached",  # removed from the tree (payloads freed once unpinned)
    )

    def __init__(self, key: bytes, parent: Node | None, namespace: Namespace, block_index: int) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[bytes, Node] = {}
        self.namespace = namespace
        self.block_index = block_index
        self.global_span: tuple[int, int] | None = None
        self.local_span: tuple[int, int] | None = None
        self.pins = 0
        self.owners: dict[str, None] = {}
        self.global_stamp = 0
        self.local_stamp = 0
        self.detached = False

    global_extent = _Span("global_span")
    local_extent = _Span("local_span")

    def payload_bytes(self) -> int:
        return sum(span[1] for span in (self.global_span, self.local_span) if span is not None)


class Namespace:
    __slots__ = ("name", "layout", "root")

    def __init__(self, name: bytes, layout: KVLayout) -> None:
        self.name = name
        self.layout = layout
        self.root = Node(b"", None, self, -1)


@dataclass(frozen=True, slots=True)
class TreeStats:
    used_bytes: int
    capacity_bytes: int
    num_blocks: int
    num_local_blocks: int
    evicted_blocks: int
    evicted_local_blocks: int
    num_namespaces: int


class RadixTree:
    def __init__(self, capacity_bytes: int, on_free: Callable[[Extent], None] | None = None) -> None:
        # Called with every extent just before it returns to the allocator (the store zeroes it there).
        self._on_free = on_free
        self.allocator = ExtentAllocator(capacity_bytes)
        self.capacity_bytes = self.allocator.capacity_bytes
        self.used_bytes = 0
        self.reserved_bytes = 0  # allocated extents not yet owned by a node
        self.num_blocks = 0
        self.evicted_blocks = 0
        self.evicted_local_blocks = 0
        self._clock = 0
        self._namespaces: dict[bytes, Namespace] = {}
        self._global_lru: OrderedDict[Node, None] = OrderedDict()  # attached nodes, oldest first
        self._local_lru: OrderedDict[Node, None] = OrderedDict()  # attached nodes with local KV
        self._by_owner: dict[tuple[bytes, str], set[Node]] = {}
        self._zombies: set[Node] = set()  # detached while pinned: payloads not yet freed

    # ---- queries -------------------------------------------------------------------------------

    def namespace(self, name: bytes, layout: KVLayout) -> Namespace | None:
        """The namespace, None if unknown; LayoutMismatch if it holds another layout."""
        ns = self._namespaces.get(name)
        if ns is not None and ns.layout != layout:
            raise LayoutMismatch(f"layout: {layout} differs from the layout stored for this namespace {ns.layout}")
        return ns

    def match(self, name: bytes, layout: KVLayout, token_bytes: bytes) -> MatchResult:
        ns = self.namespace(name, layout)
        if ns is None:
            return MISS
        matched_blocks, usable_blocks = _walk(ns, token_bytes, len(token_bytes) // layout.block_key_bytes, None)
        b = layout.block_size_tokens
        return MatchResult(matched_blocks * b, usable_blocks * b)

    def usable_path(self, name: bytes, layout: KVLayout, token_bytes: bytes, max_blocks: int) -> list[Node]:
        """Nodes of the longest usable prefix of at most max_blocks blocks (empty on a miss)."""
        ns = self.namespace(name, layout)
        if ns is None:
            return []
        path: list[Node] = []
        max_blocks = min(max_blocks, len(token_bytes) // layout.block_key_bytes)
        _, usable_blocks = _walk(ns, token_bytes, max_blocks, path)
        del path[usable_blocks:]
        return path

    def existing_path(self, start: Node, token_bytes: bytes, num_blocks: int) -> list[Node]:
        """Nodes below `start` that already hold blocks start.block_index+1 .. num_blocks-1 of a context."""
        kb = start.namespace.layout.block_key_bytes
        path = []
        node: Node | None = start
        for i in range(start.block_index + 1, num_blocks):
            node = node.children.get(token_bytes[i * kb : (i + 1) * kb])
            if node is None:
                break
            path.append(node)
        return path

    def stats(self) -> TreeStats:
        return TreeStats(
            used_bytes=self.used_bytes,
            capacity_bytes=self.capacity_bytes,
            num_blocks=self.num_blocks,
            num_local_blocks=len(self._local_lru),
            evicted_blocks=self.evicted_blocks,
            evicted_local_blocks=self.evicted_local_blocks,
            num_namespaces=len(self._namespaces),
        )

    # ---- commands: space -----------------------------------------------------------------------

    def allocate(self, length: int) -> Extent | None:
        """Reserve an extent of `length` bytes, evicting LRU entries as needed; None if everything
        that could make room is pinned. The extent counts in used_bytes until freed or inserted."""
        if aligned(length) > self.allocator.capacity_bytes:
            return None
        while True:
            if self.used_bytes + length <= self.capacity_bytes:
                extent = self.allocator.allocate(length)
                if extent is not None:
                    self.used_bytes += length
                    self.reserved_bytes += length
                    return extent
            if not self.evict_one():
                return None

    def free_reserved(self, extent: Extent) -> None:
        """Give back an extent from allocate() that was not inserted."""
        self.reserved_bytes -= extent.length
        self._free(extent)

    # ---- commands: structure -------------------------------------------------------------------

    def get_or_create_namespace(self, name: bytes, layout: KVLayout) -> Namespace:
        ns = self.namespace(name, layout)
        if ns is None:
            ns = self._namespaces[name] = Namespace(name, layout)
        return ns

    def insert(self, parent: Node, key: bytes, global_extent: Extent, local_extent: Extent | None, owner: str) -> Node:
        """Link a new child of `parent` owning the given reserved extents. The caller has checked
        that `parent` is attached and has no child with this key."""
        assert not parent.detached and key not in parent.children
        node = Node(key, parent, parent.namespace, parent.block_index + 1)
        node.global_extent = global_extent
        self.reserved_bytes -= global_extent.length
        parent.children[key] = node
        self.num_blocks += 1
        self._stamp_global(node)
        if local_extent is not None:
            self.attach_local(node, local_extent)
        self.add_owner(node, owner)
        return node

    def attach_local(self, node: Node, extent: Extent) -> None:
        """Give an attached node without local KV the reserved extent `extent` as its local KV."""
        assert node.local_extent is None and not node.detached
        node.local_extent = extent
        self.reserved_bytes -= extent.length
        self._stamp_local(node)

    def add_owner(self, node: Node, owner: str) -> None:
        if owner and owner not in node.owners:
            node.owners[owner] = None
            self._by_owner.setdefault((node.namespace.name, owner), set()).add(node)

    def touch(self, path: list[Node], local_nodes: Iterable[Node] = ()) -> None:
        """Mark a root-to-leaf path used (leaf first, keeping parents newer than children), and the
        local payloads of `local_nodes`."""
        for node in reversed(path):
            if not node.detached:
                self._stamp_global(node)
        for node in local_nodes:
            if not node.detached and node.local_extent is not None:
                self._stamp_local(node)

    def pin(self, nodes: Iterable[Node]) -> None:
        for node in nodes:
            node.pins += 1

    def unpin(self, nodes: Iterable[Node]) -> None:
        for node in nodes:
            node.pins -= 1
            assert node.pins >= 0
            if node.pins == 0 and node in self._zombies:
                self._zombies.discard(node)
                self._free_payloads(node)

    def evict_one(self) -> bool:
        """Free the least recently used unpinned local payload or unpinned leaf; False if none."""
        leaf = next((n for n in self._global_lru if n.pins == 0 and not n.children), None)
        local = next((n for n in self._local_lru if n.pins == 0), None)
        if leaf is None and local is None:
            return False
        if local is not None and (leaf is None or local.local_stamp < leaf.global_stamp):
            self._drop_local(local)
            self.evicted_local_blocks += 1
        else:
            self._remove(leaf)
            self.evicted_blocks += 1
        return True

    def drop_namespace(self, name: bytes) -> int:
        """Remove every block of a namespace; returns how many."""
        ns = self._namespaces.pop(name, None)
        if ns is None:
            return 0
        stack, nodes = list(ns.root.children.values()), []
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children.values())
        for node in sorted(nodes, key=lambda n: -n.block_index):
            self._remove(node)
        ns.root.detached = True
        return len(nodes)

    def drop_conversation(self, name: bytes, owner: str) -> int:
        """Remove the blocks put for `owner` that no other conversation put and no remaining block
        depends on; returns how many."""
        nodes = self._by_owner.pop((name, owner), set())
        for node in nodes:
            node.owners.pop(owner, None)
        removed = 0
        for node in sorted(nodes, key=lambda n: -n.block_index):  # children before parents
            if not node.detached and not node.owners and not node.children:
                self._remove(node)
                removed += 1
        return removed

    # ---- internals -----------------------------------------------------------------------------

    def _stamp_global(self, node: Node) -> None:
        self._clock += 1
        node.global_stamp = self._clock
        self._global_lru[node] = None
        self._global_lru.move_to_end(node)

    def _stamp_local(self, node: Node) -> None:
        self._clock += 1
        node.local_stamp = self._clock
        self._local_lru[node] = None
        self._local_lru.move_to_end(node)

    def _drop_local(self, node: Node) -> None:
        extent, node.local_extent = node.local_extent, None
        del self._local_lru[node]
        self._free(extent)

    def _remove(self, node: Node) -> None:
        """Detach a leaf from the tree; free its payloads now, or on its last unpin."""
        assert not node.children
        del node.parent.children[node.key]
        del self._global_lru[node]
        self._local_lru.pop(node, None)
        for owner in node.owners:
            owned = self._by_owner.get((node.namespace.name, owner))
            if owned is not None:
                owned.discard(node)
                if not owned:
                    del self._by_owner[(node.namespace.name, owner)]
        node.detached = True
        self.num_blocks -= 1
        if node.pins:
            self._zombies.add(node)
        else:
            self._free_payloads(node)

    def _free_payloads(self, node: Node) -> None:
        for extent in (node.global_extent, node.local_extent):
            if extent is not None:
                self._free(extent)
        node.global_extent = node.local_extent = None

    def _free(self, extent: Extent) -> None:
        if self._on_free is not None:
            self._on_free(extent)
        self.used_bytes -= extent.length
        self.allocator.free(extent)

    # ---- checking ------------------------------------------------------------------------------

    def attached_nodes(self) -> list[Node]:
        out = []
        for ns in self._namespaces.values():
            stack = list(ns.root.children.values())
            while stack:
                node = stack.pop()
                out.append(node)
                stack.extend(node.children.values())
        return out

    def check_invariants(self) -> None:
        """Raise AssertionError if any bookkeeping disagrees with a full recount."""
        nodes = self.attached_nodes()
        node_set = set(nodes)
        assert len(nodes) == self.num_blocks == len(self._global_lru)
        assert set(self._global_lru) == node_set
        assert set(self._local_lru) == {n for n in nodes if n.local_extent is not None}
        payload = sum(n.payload_bytes() for n in nodes) + sum(z.payload_bytes() for z in self._zombies)
        assert self.used_bytes == payload + self.reserved_bytes, (self.used_bytes, payload, self.reserved_bytes)
        assert 0 <= self.used_bytes <= self.capacity_bytes
        extents = [e for n in [*nodes, *self._zombies] for e in (n.global_extent, n.local_extent) if e is not None]
        held = sum(aligned(e.length) for e in extents)
        assert held <= self.allocator.allocated_bytes  # the rest are reserved extents
        spans = sorted((e.offset, aligned(e.length)) for e in extents) + self.allocator.free_runs()
        spans.sort()
        for (a, la), (b, _) in zip(spans, spans[1:]):
            assert a + la <= b, "extents overlap"
        for node in nodes:
            assert node.global_extent is not None and not node.detached and node.pins >= 0
            assert node.parent.children[node.key] is node
            assert node.block_index == node.parent.block_index + 1
            assert len(node.key) == node.namespace.layout.block_key_bytes
            assert self._namespaces[node.namespace.name] is node.namespace
            for owner in node.owners:
                assert node in self._by_owner[(node.namespace.name, owner)]
        for (_, _), owned in self._by_owner.items():
            assert owned and owned <= node_set
        for zombie in self._zombies:
            assert zombie.detached and zombie.pins > 0


def _walk(ns: Namespace, token_bytes: bytes, max_blocks: int, path: list[Node] | None) -> tuple[int, int]:
    """(matched blocks, usable blocks) of a context's first max_blocks blocks; appends the matched
    nodes to `path` when given. The hot loop of Match: one dict lookup per block."""
    kb = ns.layout.block_key_bytes
    window = ns.layout.window_blocks
    node = ns.root
    run = 0  # consecutive blocks with local KV ending at the current one
    usable = 0
    matched = 0
    for k in range(1, max_blocks + 1):
        node = node.children.get(token_bytes[(k - 1) * kb : k * kb])
        if node is None:
            break
        matched = k
        if path is not None:
            path.append(node)
        run = run + 1 if node.local_extent is not None else 0
        if run >= (k if k < window else window):
            usable = k
    return matched, usable
