"""bench/gc_pauses.py: both sections time a full collection against their baseline in alternated rounds and
record the medians, the ratio per round and its range; a kvstore block is two tracked objects."""

from bench.gc_pauses import engine_section, kvstore_section


def _alternated(ratio: dict, a: str, b: str) -> None:
    assert ratio["rounds"] == 3 and len(ratio["ratios"]) == 3
    assert ratio["min"] <= ratio["median"] <= ratio["max"]
    assert ratio[f"{a}_median"] > 0 and ratio[f"{b}_median"] > 0


def test_kvstore_section(capsys):
    result: dict = {}
    kvstore_section(result, 2000, 3)
    assert 2.0 <= result["kvstore_tracked_objects_per_block"] <= 2.01  # and a set of nodes per conversation
    _alternated(result["kvstore_full_collection_with_tree_over_without_x"], "with_tree", "without")
    assert "per 100,000 blocks" in capsys.readouterr().out


def test_engine_section(capsys):
    result: dict = {}
    engine_section(result, "synthetic-tiny", 3)
    assert result["engine_tracked_objects"] > 10_000
    _alternated(result["engine_full_collection_unfrozen_over_frozen_x"], "unfrozen", "frozen")
    assert "with it frozen" in capsys.readouterr().out
