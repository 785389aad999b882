"""salon/common/startup_heap.py: the first freeze moves every tracked object out of the collector's generations
(later ones do nothing), and each collection's pause is recorded under its generation."""

from __future__ import annotations

import gc

import pytest
from prometheus_client import REGISTRY

from salon.common import startup_heap


@pytest.fixture
def unfrozen(monkeypatch):
    """The module as in a service that has not served yet; the test process's heap unfrozen after."""
    monkeypatch.setattr(startup_heap, "_frozen", False)
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_first_freeze_takes_the_heap_out_of_the_generations_and_later_ones_do_nothing(unfrozen):
    before = [["start-up"]]  # a list is always tracked (a dict of atomic values is not)
    assert any(o is before for o in gc.get_objects())
    assert startup_heap.freeze_startup_heap() is True
    frozen = gc.get_freeze_count()
    assert frozen > 10_000
    assert REGISTRY.get_sample_value("salon_gc_frozen_objects") == frozen
    assert not any(o is before for o in gc.get_objects())  # full collections no longer walk it
    after = [[i] for i in range(1000)]
    assert startup_heap.freeze_startup_heap() is False
    assert gc.get_freeze_count() == frozen
    assert any(o is after[0] for o in gc.get_objects())


def test_each_collection_is_timed_under_its_generation():
    startup_heap.watch_gc_pauses()
    startup_heap.watch_gc_pauses()  # once per process: a second call adds no second callback

    def counts():
        return [REGISTRY.get_sample_value("salon_gc_pause_seconds_count", {"generation": str(g)}) for g in range(3)]

    gc.disable()  # no automatic collection between the counts
    try:
        start = counts()
        gc.collect()
        assert counts() == [start[0], start[1], start[2] + 1]
        gc.collect(0)
        assert counts() == [start[0] + 1, start[1], start[2] + 1]
    finally:
        gc.enable()
    assert REGISTRY.get_sample_value("salon_gc_pause_seconds_sum", {"generation": "2"}) > 0
