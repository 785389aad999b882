"""Tenant table (file formats, constant-time lookup) and admission (token bucket, concurrency)."""

from __future__ import annotations

import hashlib
import hmac
import json
import random

import pytest
from gateway_helpers import ACME_KEY, GLOBEX_KEY, SALT_SECRET, TENANTS, write_tenants

from salon.gateway.ratelimit import AdmissionControl, TokenBucket
from salon.gateway.tenants import Tenant, TenantConfigError, TenantTable
from salon.gateway.types import TenantId

SECRET = bytes.fromhex(SALT_SECRET)


def test_json_file(tmp_path) -> None:
    table = TenantTable.from_file(write_tenants(tmp_path / "t.json"), salt_secret=SECRET)
    acme = table.authenticate(f"Bearer {ACME_KEY}")
    assert acme is not None and acme.tenant_id == "acme" and acme.namespace_salt == "acme-salt"
    globex = table.authenticate(f"bearer {GLOBEX_KEY}")
    # Not configured: HMAC-SHA256(secret, label + tenant id), never guessable from the id alone.
    expected = hmac.new(SECRET, b"salon tenant salt v1\x00globex", hashlib.sha256).hexdigest()
    assert globex.tenant_id == "globex" and globex.namespace_salt == expected
    assert globex.max_concurrent_streams == 2
    other = TenantTable.from_file(write_tenants(tmp_path / "t.json"), salt_secret=b"another secret, 32 bytes long!!!")
    assert other.authenticate(f"Bearer {GLOBEX_KEY}").namespace_salt != expected


def test_a_tenant_without_a_salt_needs_the_secret() -> None:
    with pytest.raises(TenantConfigError, match=r"tenants\[1\]\.namespace_salt: not set.*salt-secret-file"):
        TenantTable.from_obj(TENANTS)


@pytest.mark.parametrize(
    "tenants",
    [
        [
            {"tenant_id": "a", "api_key": "12345678", "namespace_salt": "same"},
            {"tenant_id": "b", "api_key": "87654321", "namespace_salt": "same"},
        ],
        # A configured salt equal to another tenant's derived one.
        [
            {"tenant_id": "a", "api_key": "12345678"},
            {
                "tenant_id": "b",
                "api_key": "87654321",
                "namespace_salt": hmac.new(SECRET, b"salon tenant salt v1\x00a", hashlib.sha256).hexdigest(),
            },
        ],
    ],
)
def test_duplicate_salts_are_refused_at_load(tenants) -> None:
    with pytest.raises(TenantConfigError, match="tenants a and b have the same namespace_salt"):
        TenantTable.from_obj({"tenants": tenants}, salt_secret=SECRET)


def test_toml_file_and_hashed_key(tmp_path) -> None:
    digest = hashlib.sha256(b"hashed-secret-key").hexdigest()
    (tmp_path / "t.toml").write_text(
        f'[[tenants]]\ntenant_id = "a"\napi_key = "plain-secret-key"\n\n'
        f'[[tenants]]\ntenant_id = "b"\napi_key_sha256 = "{digest}"\nrequests_per_s = 5\n'
    )
    table = TenantTable.from_file(tmp_path / "t.toml", salt_secret=SECRET)
    assert table.authenticate("Bearer plain-secret-key").tenant_id == "a"
    b = table.authenticate("Bearer hashed-secret-key")
    assert b.tenant_id == "b" and b.requests_per_s == 5.0


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer ", f"Basic {ACME_KEY}", f"Bearer {ACME_KEY}x", ACME_KEY, f"Bearer {ACME_KEY[:-1]}"],
)
def test_unknown_or_malformed_keys(authorization) -> None:
    table = TenantTable.from_obj(TENANTS, salt_secret=SECRET)
    assert table.authenticate(authorization) is None


def test_anonymous_only_without_authorization() -> None:
    anon = Tenant(TenantId("anonymous"), "tenant:anonymous")
    table = TenantTable.from_obj(TENANTS, anonymous=anon, salt_secret=SECRET)
    assert table.authenticate(None) is anon
    assert table.authenticate("Bearer wrong-key-123") is None


@pytest.mark.parametrize(
    "tenants, field",
    [
        ({"tenants": [{"api_key": "12345678"}]}, "tenant_id"),
        ({"tenants": [{"tenant_id": "a/b", "api_key": "12345678"}]}, "tenant_id"),
        ({"tenants": [{"tenant_id": "a"}]}, "api_key"),
        ({"tenants": [{"tenant_id": "a", "api_key": "short"}]}, "api_key"),
        ({"tenants": [{"tenant_id": "a", "api_key_sha256": "zz"}]}, "api_key_sha256"),
        ({"tenants": [{"tenant_id": "a", "api_key": "12345678", "max_concurrent_streams": 0}]}, "max_concurrent"),
        ({"tenants": [{"tenant_id": "a", "api_key": "12345678", "requests_per_s": -1}]}, "requests_per_s"),
        ({"tenants": [{"tenant_id": "a", "api_key": "12345678"}, {"tenant_id": "a", "api_key": "87654321"}]}, "unique"),
        ({"tenants": [{"tenant_id": "a", "api_key": "12345678"}, {"tenant_id": "b", "api_key": "12345678"}]}, "share"),
        ({"nope": []}, "tenants"),
    ],
)
def test_bad_config_names_the_field(tenants, field) -> None:
    with pytest.raises(TenantConfigError, match=field):
        TenantTable.from_obj(tenants, salt_secret=SECRET)


def test_keys_never_in_repr_or_errors(tmp_path) -> None:
    table = TenantTable.from_obj(TENANTS, salt_secret=SECRET)
    text = repr(table) + repr(table.tenants)
    assert ACME_KEY not in text and GLOBEX_KEY not in text
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tenants": [{"tenant_id": "a", "api_key": "secret-key-xyz", "requests_per_s": 0}]}))
    with pytest.raises(TenantConfigError) as info:
        TenantTable.from_file(bad)
    assert "secret-key-xyz" not in str(info.value)


def test_every_key_is_compared(monkeypatch) -> None:
    """No early exit: a match on the first tenant still compares against every other digest."""
    import salon.gateway.tenants as tenants_module

    calls = []
    real = tenants_module.hmac.compare_digest
    monkeypatch.setattr(tenants_module.hmac, "compare_digest", lambda a, b: calls.append(1) or real(a, b))
    table = TenantTable.from_obj(TENANTS, salt_secret=SECRET)
    table.authenticate(f"Bearer {ACME_KEY}")
    assert len(calls) == 2
    calls.clear()
    table.authenticate("Bearer unknown-key-000")
    assert len(calls) == 2


def test_token_bucket_exact() -> None:
    bucket = TokenBucket(rate_per_s=2.0, capacity=3, now_s=100.0)
    assert [bucket.try_take(100.0) for _ in range(3)] == [None, None, None]
    assert bucket.try_take(100.0) == pytest.approx(0.5)
    assert bucket.try_take(100.25) == pytest.approx(0.25)
    assert bucket.try_take(100.5) is None
    assert bucket.available(200.0) == 3.0  # never above capacity


def test_token_bucket_against_reference() -> None:
    """Seeded random arrivals: admitted count matches a plain simulation of the bucket."""
    rng = random.Random(3)
    rate, cap = 10.0, 5
    bucket = TokenBucket(rate, cap, now_s=0.0)
    tokens, last, now = float(cap), 0.0, 0.0
    for _ in range(5000):
        now += rng.expovariate(15.0)
        tokens = min(cap, tokens + (now - last) * rate)
        last = now
        expected = tokens >= 1.0
        if expected:
            tokens -= 1.0
        assert (bucket.try_take(now) is None) == expected


def test_admission_concurrency_then_rate() -> None:
    admission = AdmissionControl(concurrency_retry_after_ms=250)
    tenant = Tenant(TenantId("t"), "s", max_concurrent_streams=2, requests_per_s=1.0, burst_requests=3)
    assert admission.admit(tenant, 0.0) is None
    assert admission.admit(tenant, 0.0) is None
    refusal = admission.admit(tenant, 0.0)
    assert (refusal.reason, refusal.retry_after_ms) == ("concurrency", 250)
    assert admission.num_open_streams(TenantId("t")) == 2
    admission.release(tenant)
    assert admission.admit(tenant, 0.0) is None  # third token of the burst
    admission.release(tenant)
    refusal = admission.admit(tenant, 0.25)
    assert (refusal.reason, refusal.retry_after_ms) == ("rate", 750)
    assert admission.admit(tenant, 1.0) is None
    # Other tenants are unaffected.
    other = Tenant(TenantId("u"), "s2", max_concurrent_streams=1)
    assert admission.admit(other, 0.0) is None
