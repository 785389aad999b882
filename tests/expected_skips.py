"""The skips CI allows, by reason, and the pytest hooks that hold a CI run to them.

Under CI (CI=true) a test may skip only for a reason below: it needs a GPU, it needs a llama.cpp build (the peer
comparisons; CI does not build llama.cpp), it exercises an AVX-512 build whose AVX2 counterpart runs in the same
test file (a CI machine may be AVX2-only, and scripts/test.sh runs the kernel and model tests once more with
AVX-512 masked), it exercises the VNNI kernel's AMX tiles, which the same tests compare with its VNNI loops (a CI
machine may lack AMX), or it needs transparent huge pages, a kernel setting of the host. Any other skip (a missing
tool, redis-server, the reference data, a C compiler) makes the session fail, naming the tests. The categories
hold on an AVX2 and on an AVX-512 machine alike. docs/testing.md states the contract.

tests/conftest.py imports the hooks; `python -m pytest -p tests.expected_skips` loads them alone.
"""

from __future__ import annotations

import re

import pytest

from tests.requirements import IN_CI

# category -> the skip reasons it covers (matched from the reason's start)
EXPECTED_SKIPS: dict[str, re.Pattern[str]] = {
    "needs CUDA": re.compile(r"needs CUDA$"),
    "needs llama.cpp": re.compile(
        r"no llama\.cpp build here \(|no llama-server here \(|this llama\.cpp build has no llama-server: "
    ),
    "needs AVX-512 (its AVX2 counterpart runs)": re.compile(
        r"needs AVX-512 VNNI and cc$|not an AVX-512 VNNI CPU with a C compiler$|this CPU has no vnni$"
        r"|this CPU does not run the avx512 C kernel$|one build of the C sampler runs here$"
        r"|packed weights are the VNNI two-term recipe's$"
    ),
    "needs AMX (its VNNI counterpart runs)": re.compile(
        r"needs AMX \(AMX-INT8 and a kernel that grants the tile state\)$"
    ),
    "needs transparent huge pages": re.compile(r"needs Linux with transparent huge pages not off$"),
}


def category(reason: str) -> str | None:
    """The category of an allowed skip reason; None for a skip CI does not allow."""
    return next((name for name, pattern in EXPECTED_SKIPS.items() if pattern.match(reason)), None)


def skip_reason(report: pytest.TestReport) -> str:
    """The reason of a skipped test's report, without pytest's "Skipped: " prefix."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


_skipped: dict[str, str] = {}  # node id -> reason, this session
_unexpected: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped[report.nodeid] = skip_reason(report)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not IN_CI:
        return
    _unexpected.update({node: reason for node, reason in _skipped.items() if category(reason) is None})
    if _unexpected and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter) -> None:
    if not IN_CI or not _skipped:
        return
    counts: dict[str, int] = {}
    for reason in _skipped.values():
        name = category(reason) or "not allowed in CI"
        counts[name] = counts.get(name, 0) + 1
    terminalreporter.write_sep("=", "skips by category (tests/expected_skips.py)")
    for name, count in sorted(counts.items()):
        terminalreporter.write_line(f"{count:5d}  {name}")
    if _unexpected:
        terminalreporter.write_sep("=", f"{len(_unexpected)} skipped tests that CI must run", red=True)
        for node, reason in sorted(_unexpected.items()):
            terminalreporter.write_line(f"{node}: {reason}")
