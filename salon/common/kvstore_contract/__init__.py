"""The kvstore's contract, shared by the kvstore and its clients (the engines).

layout.py         KVLayout (payload sizes, sliding window, usable-prefix rule), MatchResult
client.py         KVStoreClient: match / fetch / put that never fail the caller
arena_mapping.py  a client's mapping of the kvstore's shared-memory arena
writer_lock.py    the lock a writing client holds on the arena, so the kvstore knows when it is gone
"""
