"""The cache_salt sub-namespaces each dialogue used on this engine, so that erasing the dialogue erases them too.

A request with a cache_salt caches its KV under salted_namespace_salt(tenant salt, cache_salt)'s namespace
(salon/common/prefix_hash.py), in the device cache only; DeleteConversation names the tenant's salt, so the
engine remembers, per (tenant salt, conversation), which of those namespaces it filled. Bounded (LRU): a
dialogue that falls out keeps its salted entries until the device cache evicts them.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_DIALOGUES = 65536
MAX_SALTS_PER_DIALOGUE = 64


class SaltedNamespaces:
    def __init__(self, capacity: int = MAX_DIALOGUES) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[tuple[str, str], dict[bytes, None]] = OrderedDict()

    def note(self, tenant_salt: str, conversation_id: str, namespace: bytes) -> None:
        key = (tenant_salt, conversation_id)
        namespaces = self._entries.setdefault(key, {})
        namespaces[namespace] = None
        while len(namespaces) > MAX_SALTS_PER_DIALOGUE:
            del namespaces[next(iter(namespaces))]
        self._entries.move_to_end(key)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def take(self, tenant_salt: str, conversation_id: str) -> list[bytes]:
        """The dialogue's salted namespaces, forgotten here (the caller erases them)."""
        return list(self._entries.pop((tenant_salt, conversation_id), {}))
