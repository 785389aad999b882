"""Helpers shared by the kvstore tests: deterministic payloads and a store over a small arena."""

from __future__ import annotations

import hashlib

from salon.common.kvstore_contract.layout import KVLayout
from salon.common.prefix_hash import encode_token_ids
from salon.kvstore.arena import Arena
from salon.kvstore.radix_tree import RadixTree
from salon.kvstore.store import KVStore

# 4-token blocks, 64 B global (one alignment unit) and 128 B local per block, window of 5 tokens:
# a continuation at a block boundary needs local KV of the last ceil((5 - 1) / 4) = 1 block.
LAYOUT = KVLayout(block_size_tokens=4, global_bytes_per_block=64, local_bytes_per_block=128, sliding_window_tokens=5)
NS_A = b"A" * 32
NS_B = b"B" * 32


def payload(namespace: bytes, token_ids: list[int], block_index: int, kind: str, length: int, block_size: int) -> bytes:
    """The bytes a test stores for a block: a function of namespace and the whole prefix, so any
    byte returned for the wrong prefix or from a reused extent is detected."""
    seed = hashlib.sha256(namespace + kind.encode() + encode_token_ids(token_ids[: (block_index + 1) * block_size]))
    out = b""
    counter = 0
    while len(out) < length:
        out += hashlib.sha256(seed.digest() + counter.to_bytes(4, "little")).digest()
        counter += 1
    return out[:length]


def make_store(tmp_path, capacity_bytes: int, lease_ttl_s: float = 30.0, clock=None, **kwargs) -> KVStore:
    arena = Arena(str(tmp_path), capacity_bytes)
    if clock is not None:
        kwargs["clock"] = clock
    return KVStore(RadixTree(capacity_bytes, on_free=arena.zero), arena, lease_ttl_s, **kwargs)


def put(
    store: KVStore,
    namespace: bytes,
    token_ids: list[int],
    local_blocks: set[int] | None = None,
    owner: str = "",
    layout: KVLayout = LAYOUT,
    first_block: int = 0,
):
    """Put every whole block of token_ids from first_block on (local KV for local_blocks)."""
    local_blocks = local_blocks or set()
    token_bytes = encode_token_ids(token_ids)
    session = store.begin_put(namespace, layout, token_bytes, owner)
    b = layout.block_size_tokens
    for i in range(first_block, len(token_ids) // b):
        g = payload(namespace, token_ids, i, "g", layout.global_bytes_per_block, b)
        loc = payload(namespace, token_ids, i, "l", layout.local_bytes_per_block, b) if i in local_blocks else None
        session.add_block(i, g, loc)
    return session.close()


def fetch_bytes(store: KVStore, namespace: bytes, token_ids: list[int], layout: KVLayout = LAYOUT, max_tokens: int = 0):
    """(num_tokens, [(global bytes, local bytes | None)]) of a fetch, read from the arena."""
    plan = store.begin_fetch(namespace, layout, encode_token_ids(token_ids), max_tokens)
    try:
        blocks = []
        for i, node in enumerate(plan.nodes):
            g = bytes(store.arena.read(node.global_extent))
            loc = bytes(store.arena.read(node.local_extent)) if i >= plan.local_from_block else None
            blocks.append((g, loc))
        return plan.num_tokens, blocks
    finally:
        store.end_fetch(plan)


# ---- a real kvstore process -------------------------------------------------------------------

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS  # noqa: E402
from salon.common.kvstore_contract.client import KVStoreClient  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]


class KVStoreProcess:
    """`python -m salon.kvstore` as a subprocess; `port` parsed from its LISTENING line."""

    def __init__(
        self,
        shm_dir,
        capacity_bytes: int,
        port: int = 0,
        lease_ttl_s: float = 30.0,
        extra: tuple[str, ...] = INSECURE_LOOPBACK_FLAGS,
    ) -> None:
        self.shm_dir = str(shm_dir)
        args = [
            sys.executable,
            "-m",
            "salon.kvstore",
            "--port",
            str(port),
            "--capacity-bytes",
            str(capacity_bytes),
            "--shm-dir",
            str(shm_dir),
            "--lease-ttl-s",
            str(lease_ttl_s),
            "--grace-s",
            "1",
            *extra,
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.proc = subprocess.Popen(
            args, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        deadline = time.monotonic() + 60
        self.port = None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("LISTENING kvstore"):
                self.port = int(line.split("port=")[1].split()[0])
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("kvstore did not start")
        self.target = f"127.0.0.1:{self.port}"

    async def client(self, use_shared_memory: bool = False, **kwargs) -> KVStoreClient:
        """An engine's client of this kvstore, its arena mapped when use_shared_memory."""
        client = KVStoreClient(self.target, use_shared_memory=use_shared_memory, arena_dir=self.shm_dir, **kwargs)
        if use_shared_memory:
            assert await client.map_arena(), "the arena could not be mapped"
        return client

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc.stdout.close()
        return self.proc.returncode


def block_rows(namespace: bytes, token_ids: list[int], block_indices, row_bytes: int, kind: str, b: int) -> np.ndarray:
    """uint8 [len(block_indices), row_bytes]: each row a function of namespace + the block's prefix
    (b = block size in tokens)."""
    out = np.empty((len(block_indices), row_bytes), np.uint8)
    for r, i in enumerate(block_indices):
        seed = hashlib.sha256(namespace + kind.encode() + encode_token_ids(token_ids[: (i + 1) * b])).digest()
        out[r] = np.random.default_rng(int.from_bytes(seed[:8], "little")).integers(0, 256, row_bytes, np.uint8)
    return out
