"""Hypothesis stateful test of the store's invariants under random puts, fetches, pins, drops, leases.

After every step: the tree's bookkeeping equals a full recount (check_invariants), every stored
byte is the payload of exactly its own prefix (so nothing is misplaced, overwritten or freed while
reachable), pinned blocks keep their bytes, and match agrees with a naive recomputation.
"""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kvstore_testlib import NS_A, NS_B, make_store, payload, put

from salon.common.kvstore_contract.layout import KVLayout
from salon.common.prefix_hash import decode_token_ids, encode_token_ids

LAYOUTS = {NS_A: KVLayout(4, 64, 128, 5), NS_B: KVLayout(4, 100, 200, 9)}
CAPACITY_BYTES = 1600

contexts = st.lists(st.integers(0, 2), min_size=0, max_size=24)
namespaces = st.sampled_from([NS_A, NS_B])
owners = st.sampled_from(["", "c1", "c2"])


def prefix_tokens(node) -> list[int]:
    keys = []
    while node.parent is not None:
        keys.append(node.key)
        node = node.parent
    return decode_token_ids(b"".join(reversed(keys)))


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp()
        self.store = make_store(self.dir, CAPACITY_BYTES)
        self.plans = []  # (namespace, plan, leased id or None)
        self.prepared = []  # (namespace, tokens, lease, slots)
        self.history = []  # contexts put so far: later queries mostly revisit them

    def pick(self, data, ctx):
        """A context to query: a stored one, cut or extended (so queries mostly hit), or `ctx`."""
        if self.history and data.draw(st.booleans()):
            base = data.draw(st.sampled_from(self.history))
            cut = data.draw(st.integers(0, len(base)))
            return base[:cut] + data.draw(st.lists(st.integers(0, 2), max_size=8))
        return ctx

    def teardown(self) -> None:
        self.store.close()
        self.store.arena.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(ns=namespaces, ctx=contexts, local_blocks=st.sets(st.integers(0, 5)), owner=owners)
    def put(self, ns, ctx, local_blocks, owner) -> None:
        self.history.append(ctx)
        put(self.store, ns, ctx, local_blocks, owner, layout=LAYOUTS[ns])

    @rule(ns=namespaces, ctx=contexts, max_tokens=st.integers(0, 24), lease=st.booleans(), data=st.data())
    def fetch(self, ns, ctx, max_tokens, lease, data) -> None:
        ctx = self.pick(data, ctx)
        plan = self.store.begin_fetch(ns, LAYOUTS[ns], encode_token_ids(ctx), max_tokens)
        expected = self.store.match(ns, LAYOUTS[ns], encode_token_ids(ctx[: max_tokens or None])).usable_tokens
        assert plan.num_tokens == expected
        lease_id = self.store.lease_fetch(plan) if lease else None
        self.plans.append((ns, plan, lease_id))

    @precondition(lambda self: self.plans)
    @rule(data=st.data())
    def end_fetch(self, data) -> None:
        ns, plan, lease_id = self.plans.pop(data.draw(st.integers(0, len(self.plans) - 1)))
        if lease_id is None:
            self.store.end_fetch(plan)
        else:
            assert self.store.release_lease(lease_id)

    @rule(ns=namespaces, ctx=contexts, local_blocks=st.sets(st.integers(0, 5)), owner=owners)
    def prepare_shared_put(self, ns, ctx, local_blocks, owner) -> None:
        self.history.append(ctx)
        layout = LAYOUTS[ns]
        lease, slots, _ = self.store.prepare_shared_put(
            ns, layout, encode_token_ids(ctx), owner, len(ctx) // 4, frozenset(local_blocks)
        )
        self.prepared.append((ns, ctx, lease, slots))

    @precondition(lambda self: self.prepared)
    @rule(data=st.data(), commit=st.booleans())
    def finish_shared_put(self, data, commit) -> None:
        ns, ctx, lease, slots = self.prepared.pop(data.draw(st.integers(0, len(self.prepared) - 1)))
        layout = LAYOUTS[ns]
        for s in slots:
            if s.global_extent is not None:
                self.store.arena.write(s.global_extent, payload(ns, ctx, s.block_index, "g", s.global_extent.length, 4))
            if s.local_extent is not None:
                self.store.arena.write(s.local_extent, payload(ns, ctx, s.block_index, "l", s.local_extent.length, 4))
        if commit:
            assert self.store.commit_shared_put(lease) is not None
        else:
            assert self.store.release_lease(lease)
        del layout

    @rule(ns=namespaces, owner=owners)
    def drop(self, ns, owner) -> None:
        self.store.drop(ns, owner)

    @rule()
    def evict_one(self) -> None:
        self.store.tree.evict_one()

    @rule(ns=namespaces, ctx=contexts, data=st.data())
    def match_agrees_with_naive(self, ns, ctx, data) -> None:
        ctx = self.pick(data, ctx)
        layout = LAYOUTS[ns]
        result = self.store.match(ns, layout, encode_token_ids(ctx))
        stored = {}
        for node in self.store.tree.attached_nodes():
            if node.namespace.name == ns:
                stored[tuple(prefix_tokens(node))] = node.local_extent is not None
        matched = 0
        while len(ctx) >= (matched + 1) * 4 and tuple(ctx[: (matched + 1) * 4]) in stored:
            matched += 1
        usable = 0
        for k in range(1, matched + 1):
            need = min(k, layout.window_blocks)
            if all(stored[tuple(ctx[: (i + 1) * 4])] for i in range(k - need, k)):
                usable = k
        assert (result.matched_tokens, result.usable_tokens) == (matched * 4, usable * 4)

    @invariant()
    def bookkeeping_is_exact(self) -> None:
        self.store.tree.check_invariants()

    @invariant()
    def every_byte_is_its_own_prefix(self) -> None:
        arena = self.store.arena
        nodes = self.store.tree.attached_nodes() + [n for _, plan, _ in self.plans for n in plan.nodes]
        for node in nodes:
            assert node.global_extent is not None  # pinned nodes keep their payloads even if dropped
            ns, tokens = node.namespace.name, prefix_tokens(node)
            g = node.global_extent
            assert bytes(arena.read(g)) == payload(ns, tokens, node.block_index, "g", g.length, 4)
            if node.local_extent is not None:
                loc = node.local_extent
                assert bytes(arena.read(loc)) == payload(ns, tokens, node.block_index, "l", loc.length, 4)
        for _, plan, _ in self.plans:  # the window blocks a fetch promised keep their local KV
            assert all(n.local_extent is not None for n in plan.nodes[plan.local_from_block :])


StoreMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestStoreMachine = StoreMachine.TestCase
