"""A request's block hashes: computed once, extended as its tokens grow, equal to hashing from scratch."""

from __future__ import annotations

import random

from salon.common.prefix_hash import block_hashes, namespace_digest
from salon.engine.request import Request, RequestId, SamplingParams

NS = namespace_digest("gemma-3-270m", "int8-b16", "tenant-a")


def test_a_request_extends_its_hashes_as_its_tokens_grow() -> None:
    rng = random.Random(5)
    prompt = [rng.randrange(1000) for _ in range(70)]
    req = Request(RequestId("r"), list(prompt), SamplingParams(8), frozenset(), 4096, namespace=NS)
    assert req.block_hashes(33, 16) == block_hashes(NS, prompt[:32], 16)
    req.output_token_ids.extend(rng.randrange(1000) for _ in range(30))
    everything = prompt + req.output_token_ids
    for n in (100, 17, 64, 96, 100):
        assert req.block_hashes(n, 16) == block_hashes(NS, everything[:n], 16)
    assert req.block_hashes(64, 8) == block_hashes(NS, everything[:64], 8)  # another block size starts over
