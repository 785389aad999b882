"""A bounded soak through the gateway (bench/soak.py --quick: real processes, loopback, ~15 s):
below capacity nothing fails; above capacity the excess gets RESOURCE_EXHAUSTED quickly and nothing
times out; RSS stays roughly flat; the engines' accounting ends clean."""

from __future__ import annotations

import json

from bench.soak import run_soak

# RSS may grow by this much over its lowest figure after warm-up (allocator arenas, grpc buffers at peak fan-out),
# whichever is larger: a leak of one reply's state per request would pass it within the run.
RSS_MARGIN_KIB = 64 * 1024
RSS_MARGIN_FRACTION = 0.25


def test_soak(tmp_path) -> None:
    report = run_soak(tmp_path, quick=True)
    phases = {p.name: p for p in report.phases}
    for phase in report.phases:
        print(json.dumps(phase.summary()))
    print("rss_kib", json.dumps(report.rss_kib))
    for name in ("warmup", "below", "below_again"):
        phase = phases[name]
        assert phase.num_requests == phase.num_ok == {"warmup": 48}.get(name, 160), phase.summary()
        assert phase.errors == {}
    above = phases["above"]
    assert above.errors == {}, above.errors  # no DEADLINE_EXCEEDED, UNAVAILABLE, ...: only refusals
    assert above.num_ok + above.num_resource_exhausted == above.num_requests
    assert above.num_resource_exhausted > 0 and above.num_ok > 0
    assert max(above.refusal_latency_ms) < 5000, "refusals must be fast, not queued"
    for process, growth_kib in report.rss_growth_kib().items():
        base_kib = min(c[process] for c in report.rss_kib.values())
        assert growth_kib <= max(RSS_MARGIN_KIB, RSS_MARGIN_FRACTION * base_kib), (process, growth_kib)
    assert report.engines_clean == {"e0": True, "e1": True}
