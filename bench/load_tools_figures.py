"""What guidellm and aiperf wrote, read back as one row per benchmark run (`RunFigures`).

guidellm 0.8.1 (`--output kind=json`): one report holds a benchmark per profile strategy; each has
`metrics.request_totals` (successful / errored / incomplete), latency distributions over the successful
requests (`metrics.<name>.successful.median`, `.percentiles.p95`) and server-wide rates over all requests
(`metrics.output_tokens_per_second.total.mean`, the figure its console prints as Output Tokens Per Sec).

aiperf 0.13.0 (`--output-artifact-dir DIR`): `profile_export.jsonl` holds a record per request, with an
`error` object when the request failed; `profile_export_aiperf.json` holds the aggregates (`p50`, `p95`,
`avg` per metric) and is written only when at least one request succeeded. Counts come from the records, so
a run whose every request failed still reads as what it was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class RunFigures:
    tool: str  # guidellm | aiperf
    profile: str  # e.g. synchronous, concurrent@4
    num_requests_ok: int
    num_requests_errored: int
    num_requests_incomplete: int
    ttft_ms_p50: float | None
    ttft_ms_p95: float | None
    itl_ms_p50: float | None
    itl_ms_p95: float | None
    output_tokens_per_s: float | None  # generated tokens over the run's wall time, all streams together
    first_error: str | None = None

    @property
    def clean(self) -> bool:
        """Every request sent completed without an error, and there was at least one."""
        return self.num_requests_ok > 0 and self.num_requests_errored == 0 and self.num_requests_incomplete == 0


class FiguresError(ValueError):
    """A tool's output is missing or not in the shape its version writes."""


def guidellm_figures(report: dict) -> list[RunFigures]:
    """One row per benchmark in a guidellm JSON report, in run order."""
    benchmarks = report.get("benchmarks")
    if not benchmarks:
        raise FiguresError("guidellm report holds no benchmarks")
    return [_guidellm_run(b) for b in benchmarks]


def _guidellm_run(benchmark: dict) -> RunFigures:
    metrics = benchmark["metrics"]
    totals = metrics["request_totals"]
    ok = int(totals["successful"])

    def latency(name: str, which: str) -> float | None:
        stats = metrics[name]["successful"]
        if not ok or not stats["count"]:
            return None
        return float(stats["median"] if which == "p50" else stats["percentiles"][which])

    errored = benchmark.get("requests", {}).get("errored") or []
    return RunFigures(
        tool="guidellm",
        profile=_guidellm_strategy(benchmark["config"]["strategy"]),
        num_requests_ok=ok,
        num_requests_errored=int(totals["errored"]),
        num_requests_incomplete=int(totals["incomplete"]),
        ttft_ms_p50=latency("time_to_first_token_ms", "p50"),
        ttft_ms_p95=latency("time_to_first_token_ms", "p95"),
        itl_ms_p50=latency("inter_token_latency_ms", "p50"),
        itl_ms_p95=latency("inter_token_latency_ms", "p95"),
        output_tokens_per_s=float(metrics["output_tokens_per_second"]["total"]["mean"]) if ok else None,
        first_error=(errored[0].get("error") or errored[0].get("info", {}).get("error")) if errored else None,
    )


def _guidellm_strategy(strategy: dict) -> str:
    kind = strategy["type_"]
    if kind == "concurrent":
        return f"concurrent@{strategy['streams']}"
    if kind in ("constant", "poisson"):
        return f"{kind}@{strategy['rate']}/s"
    return kind


def aiperf_figures(profile: str, records_jsonl: str, aggregate: dict | None) -> RunFigures:
    """One row for an aiperf run: counts from its per-request records (profiling phase), latency and
    throughput from its aggregate export (None when it wrote none: no request succeeded)."""
    records = [json.loads(line) for line in records_jsonl.splitlines() if line.strip()]
    records = [r for r in records if r.get("metadata", {}).get("benchmark_phase", "profiling") == "profiling"]
    if not records:
        raise FiguresError("aiperf wrote no request records")
    failed = [r for r in records if r.get("error")]
    ok = len(records) - len(failed)
    if ok and aggregate is None:
        raise FiguresError("aiperf recorded successful requests but wrote no aggregate export")

    def stat(name: str, which: str) -> float | None:
        if not ok or name not in aggregate or which not in aggregate[name]:
            return None
        return float(aggregate[name][which])

    first_error = None
    if failed:
        error = failed[0]["error"]
        first_error = f"{error.get('code')} {error.get('message')}"
    return RunFigures(
        tool="aiperf",
        profile=profile,
        num_requests_ok=ok,
        num_requests_errored=len(failed),
        num_requests_incomplete=0,
        ttft_ms_p50=stat("time_to_first_token", "p50"),
        ttft_ms_p95=stat("time_to_first_token", "p95"),
        itl_ms_p50=stat("inter_token_latency", "p50"),
        itl_ms_p95=stat("inter_token_latency", "p95"),
        output_tokens_per_s=stat("output_token_throughput", "avg"),
        first_error=first_error,
    )


def figures_table(rows: list[RunFigures]) -> str:
    """The rows as a fixed-width table; '-' where a figure does not exist."""

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    header = (
        f"{'tool':<9} {'profile':<14} {'ok':>4} {'errors':>6} {'TTFT p50':>9} {'TTFT p95':>9} "
        f"{'ITL p50':>8} {'ITL p95':>8} {'out tok/s':>9}"
    )
    lines = [header]
    for r in rows:
        lines.append(
            f"{r.tool:<9} {r.profile:<14} {r.num_requests_ok:>4} "
            f"{r.num_requests_errored + r.num_requests_incomplete:>6} {cell(r.ttft_ms_p50):>9} "
            f"{cell(r.ttft_ms_p95):>9} {cell(r.itl_ms_p50):>8} {cell(r.itl_ms_p95):>8} "
            f"{cell(r.output_tokens_per_s):>9}"
        )
        if r.first_error:
            lines.append(f"  first error: {r.first_error[:300]}")
    return "\n".join(lines)
