"""Fixtures shared by every test area; every test's tier marker (tests/tiers.py); under CI, the check of the
session's skips (tests/expected_skips.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.expected_skips import (  # noqa: F401 (pytest finds hooks by name in a conftest)
    pytest_runtest_logreport,
    pytest_sessionfinish,
    pytest_terminal_summary,
)
from tests.tiers import TIERS, tiers_of


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test gets its tier markers (unit, process, model) from its module, so `-m unit` selects the quick
    in-process tier whoever wrote the test."""
    for item in items:
        explicit = {m.name for m in item.iter_markers() if m.name in TIERS}
        for tier in sorted(tiers_of(Path(str(item.path)), explicit) - explicit):
            item.add_marker(tier)


@dataclass(frozen=True)
class TLSFiles:
    """PEM files of a throw-away CA: a server certificate (localhost, 127.0.0.1) and a client certificate
    without a salon identity, one certificate per salon role (SPIFFE ID spiffe://salon/<role>/<role>,
    also valid for localhost and 127.0.0.1), and the certificate of an unrelated CA."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca_cert: Path
    roles: dict[str, tuple[Path, Path]] = field(default_factory=dict)

    def cert(self, role: str) -> Path:
        return self.roles[role][0]

    def key(self, role: str) -> Path:
        return self.roles[role][1]


def _make_certs(directory: Path) -> TLSFiles:
    from salon.cli.certs import issue, make_ca, pem_cert, pem_key
    from salon.common.peer_identity import ROLES, spiffe_id

    def write(name: str, key, cert) -> tuple[Path, Path]:
        (directory / f"{name}.key").write_bytes(pem_key(key))
        (directory / f"{name}.pem").write_bytes(pem_cert(cert))
        return directory / f"{name}.pem", directory / f"{name}.key"

    ca_key, ca = make_ca("salon test CA", days=1)
    _other_key, other_ca = make_ca("some other CA", days=1)
    (directory / "ca.pem").write_bytes(pem_cert(ca))
    (directory / "other-ca.pem").write_bytes(pem_cert(other_ca))
    server = write("server", *issue(ca_key, ca, None, ["localhost"], days=1, common_name="localhost"))
    client = write("client", *issue(ca_key, ca, None, [], ip_addresses=[], days=1, common_name="salon-client"))
    roles = {role: write(role, *issue(ca_key, ca, spiffe_id(role, role), ["localhost"], days=1)) for role in ROLES}
    return TLSFiles(directory / "ca.pem", *server, *client, directory / "other-ca.pem", roles)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory) -> TLSFiles:
    """Certificates generated for this test session (never committed)."""
    return _make_certs(tmp_path_factory.mktemp("tls"))
