"""Which model a request that names none goes to (ModelPools.default_model / resolve): the configured
default, even while its engines have not reported yet (the request waits as for any named model: UNAVAILABLE,
then served), never another model because its engines reported first; without a configured default, the
model of the first configured engine that has reported."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from salon.common.errors import NotFound, Unavailable
from salon.gateway.model_pools import ModelPools


class _Engines:
    """The engine handles ModelPools reads: each with the model its watch last reported (None: not yet)."""

    def __init__(self, *models: str | None) -> None:
        self.list = [SimpleNamespace(report=None if m is None else SimpleNamespace(model_id=m)) for m in models]

    def handles(self):
        return self.list

    def report(self, i: int, model: str) -> None:
        self.list[i].report = SimpleNamespace(model_id=model)


def _pools(engines: _Engines, default: str = "") -> ModelPools:
    return ModelPools(engines, make_policy=lambda: None, default_model=default)


def test_the_configured_default_is_kept_while_its_engines_have_not_reported():
    engines = _Engines(None, "tiny")  # the default's engine is still loading; another model's has reported
    pools = _pools(engines, "smol")
    assert pools.default_model() == "smol"
    with pytest.raises(Unavailable, match="'smol'"):
        pools.resolve("")  # not routed to "tiny"
    engines.report(0, "smol")
    assert pools.resolve("") == "smol" and pools.resolve("tiny") == "tiny"


def test_a_configured_default_nobody_serves_is_not_found_once_all_have_reported():
    pools = _pools(_Engines("tiny", "tiny"), "smol")
    with pytest.raises(NotFound, match=r"'smol' is not served here \(served: tiny\)"):
        pools.resolve("")


def test_without_a_configured_default_the_first_configured_engine_that_reported_decides():
    engines = _Engines(None, "b", "a")
    pools = _pools(engines)
    assert pools.default_model() == "b" and pools.resolve("") == "b"
    engines.report(0, "a")
    assert pools.default_model() == "a"
    assert _pools(_Engines(None)).default_model() is None
    with pytest.raises(Unavailable, match="no engine has reported"):
        _pools(_Engines(None)).resolve("")
