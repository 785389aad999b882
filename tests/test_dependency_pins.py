"""Dependencies: pyproject.toml's minimums sit past known security fixes, constraints.txt pins every dependency
at a version those minimums allow, and the quickstart and the image install with it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

# Releases with known vulnerabilities that the minimums must exclude: package -> (versions, why).
VULNERABLE = {
    "jinja2": (["3.1.4", "3.1.5"], "sandbox escapes (CVE-2024-56201, CVE-2025-27516); GGUF chat templates run there"),
    "protobuf": (
        ["5.29.4", "5.29.5", "6.30.2", "6.31.0", "6.33.4"],
        "recursion DoS (CVE-2025-4565 before 5.29.5 / 6.31.1, CVE-2026-0994 before 5.29.6 / 6.33.5)",
    ),
    "cryptography": (["44.0.0", "48.0.0", "49.0.0"], "CVE-2026-69249 (before 49.0.0), CVE-2026-69247 (before 50.0.0)"),
    "h11": (["0.14.0", "0.15.0"], "request smuggling (CVE-2025-43859)"),
    "starlette": (["0.47.1", "0.49.0", "1.3.0"], "DoS and URL validation fixes (CVE-2025-62727, 2026 advisories)"),
    "requests": (["2.32.3", "2.32.5"], "CVE-2024-47081, CVE-2026-25645"),
    "urllib3": (["2.5.0", "2.6.3"], "decompression bombs (CVE-2025-66471, CVE-2026-44432)"),
    "setuptools": (["77.0.3", "78.1.0"], "path traversal (CVE-2025-47273)"),
}


def _requirements() -> dict[str, Requirement]:
    """Every requirement of the project, its dev extra and its build, by canonical name."""
    texts = [
        *PYPROJECT["project"]["dependencies"],
        *PYPROJECT["project"]["optional-dependencies"]["dev"],
        *PYPROJECT["build-system"]["requires"],
    ]
    return {canonicalize_name(r.name): r for r in map(Requirement, texts)}


def _runtime_requirements() -> dict[str, Requirement]:
    build = {canonicalize_name(Requirement(t).name) for t in PYPROJECT["build-system"]["requires"]}
    return {name: r for name, r in _requirements().items() if name not in build}


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.!]*)", line)
        assert m, f"constraints.txt: not `name==version` (no local labels, no editable installs): {line!r}"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"constraints.txt pins {name} twice"
        pins[name] = Version(m.group(2))
    return pins


def test_constraints_pin_every_dependency_at_a_version_pyproject_allows():
    pins = _pins()
    assert "salon" not in pins
    for name, requirement in _runtime_requirements().items():
        assert name in pins, f"{name} has no pin in constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject.toml's {requirement}"
        )


@pytest.mark.parametrize("package", sorted(VULNERABLE))
def test_the_minimums_exclude_releases_with_known_vulnerabilities(package):
    versions, why = VULNERABLE[package]
    requirement = _requirements()[package]
    for version in versions:
        assert not requirement.specifier.contains(version), f"{requirement} allows {package} {version}: {why}"
    pin = _pins().get(package)
    assert pin is not None and requirement.specifier.contains(pin), (package, pin)


def test_the_quickstart_and_the_image_install_with_the_constraints():
    setup = (REPO / "scripts" / "setup.sh").read_text()
    dockerfile = (REPO / "Dockerfile").read_text()
    installs = [
        line
        for text in (setup, dockerfile)
        for line in text.splitlines()
        if re.search(r"pip install", line) and not line.lstrip().startswith("#") and "--upgrade pip" not in line
    ]
    assert len(installs) >= 5, installs  # torch, the package (+dev), the GGUF package; torch and the package
    for line in installs:
        assert "-c constraints.txt" in line, line
    assert "COPY constraints.txt" in dockerfile
    assert dockerfile.index("COPY constraints.txt") < dockerfile.index("-c constraints.txt")
