"""Engine cores and requests for in-process tests (no gRPC): one place for every test area.

core = make_core(model_and_tokenizer, budget=64, kv_bytes=4 << 20)
out = run(core, [make_request("a", tokens(150, seed=1), max_new=24)])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from salon.engine.config import SchedulerConfig
from salon.engine.core.engine_core import EngineCore
from salon.engine.prefix.hit import PrefixHit
from salon.engine.request import (
    FinishReason,
    Request,
    RequestId,
    SamplingParams,
)

BLOCK_SIZE_TOKENS = 16


def make_core(
    model_and_tokenizer,
    budget: int = 256,
    kv_bytes: int = 4 << 20,
    max_running: int = 64,
    max_waiting: int = 256,
    prefix_caching: bool = True,
    block_size_tokens: int = BLOCK_SIZE_TOKENS,
    kv_dtype: str = "int8",
    speculative_tokens: int = 0,
    ngram: tuple[int, int] = (2, 4),
    kernels: str = "auto",
    long_prefill_tokens: int = SchedulerConfig.long_prefill_tokens,
    long_prefill_solo_tokens: int = SchedulerConfig.long_prefill_solo_tokens,
    device: str = "cpu",
    speculative_max_rows: int = SchedulerConfig.speculative_max_rows,
) -> EngineCore:
    model, tok = model_and_tokenizer
    config = SchedulerConfig(
        budget,
        max_running,
        max_waiting,
        speculative_tokens=speculative_tokens,
        ngram_min=ngram[0],
        ngram_max=ngram[1],
        long_prefill_tokens=long_prefill_tokens,
        long_prefill_solo_tokens=long_prefill_solo_tokens,
        speculative_max_rows=speculative_max_rows,
    )
    return EngineCore(
        model,
        tok,
        config,
        block_size_tokens,
        kv_bytes,
        device,
        prefix_caching=prefix_caching,
        kv_dtype=kv_dtype,
        kernels=kernels,
    )


def tokens(n: int, seed: int) -> list[int]:
    """A BOS and n - 1 distinct-looking token ids, the same for the same (n, seed)."""
    return [2] + [1000 + (i * 7919 + seed * 104729) % 200000 for i in range(n - 1)]


def make_request(
    rid: str,
    prompt: Sequence[int],
    max_new: int = 12,
    *,
    namespace: bytes | None = None,
    retain_from: int | None = None,
    stop_token_ids: frozenset[int] = frozenset(),
    max_context_tokens: int = 4096,
    **sampling,
) -> Request:
    """A request with SamplingParams(max_new_tokens=max_new, **sampling) and, optionally, a cache namespace."""
    r = Request(
        RequestId(rid),
        list(prompt),
        SamplingParams(max_new_tokens=max_new, **sampling),
        stop_token_ids,
        max_context_tokens,
    )
    r.namespace = namespace
    r.retain_local_from = retain_from
    return r


def run(
    core: EngineCore, requests: Sequence[Request], host_hits: dict[str, PrefixHit] | None = None
) -> tuple[dict[str, list[int]], dict[str, FinishReason]]:
    """Add the requests (with their host hits) and step until the engine is idle: tokens and finish
    reason per request id."""
    for r in requests:
        core.add(r, (host_hits or {}).get(r.request_id))
    out: dict[str, list[int]] = {r.request_id: [] for r in requests}
    finish: dict[str, FinishReason] = {}
    while core.has_work():
        for e in core.step():
            out[e.request_id] += e.token_ids
            if e.finish_reason is not None:
                finish[e.request_id] = e.finish_reason
    return out, finish


def run_one(core: EngineCore, request: Request, host_hit: PrefixHit | None = None) -> list[int]:
    """The tokens one request generates on its own."""
    out, _ = run(core, [request], {request.request_id: host_hit} if host_hit is not None else None)
    return out[request.request_id]


def blocks_accounted(core: EngineCore) -> bool:
    """Every block is free or held by the device cache (nothing leaked by a request)."""
    cached = core.kv_manager.num_reclaimable_blocks
    return core.kv_manager.num_free_blocks + cached == core.layout.num_blocks


def logits_rows(core, requests, host_hits=None) -> dict[str, list[torch.Tensor]]:
    """Run the requests to the end; per request id, its logits row at every sampled step."""
    rows: dict[str, list[torch.Tensor]] = {r.request_id: [] for r in requests}

    def observe(sampled, logits):
        for request, row in zip(sampled, logits):
            rows[request.request_id].append(row.clone())

    core.runner.logits_observer = observe
    for r in requests:
        core.add(r, (host_hits or {}).get(r.request_id))
    while core.has_work():
        core.step()
    core.runner.logits_observer = None
    return rows


def assert_rows_equal(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want) > 0
    for step, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"logits differ at step {step}: max |diff| {(a - b).abs().max().item():.3e}"
