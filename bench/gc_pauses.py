"""The garbage collector's full collections in a service's heap, in alternated rounds (salon/common/startup_heap.py,
salon/kvstore/radix_tree.py). A full collection walks every object the collector tracks with the GIL held: its
time is how long a service's event loop (and an engine's step thread) stands still.

  engine    the model and tokenizer loaded as the engine loads them (--model): a full collection with the start-up
            heap in the collector's generations, against the same heap frozen (what a service does when it first
            serves), a ratio per round;
  kvstore   a radix tree of --blocks stored blocks (dialogues of 200 blocks, one owner each plus one shared): the
            tracked objects a block adds, and a full collection with the tree built against one without it (the
            tree built anew each round, the process's own heap frozen in both), a ratio per round and the pause
            the tree adds per 100,000 blocks.

No peer runs a heap of this kind: "peer": null.

    python -m bench.gc_pauses [--quick] [--model NAME] [--blocks N] [--rounds N]
"""

from __future__ import annotations

import argparse
import gc
import json
import struct
import time

from salon.common.kvstore_contract.layout import KVLayout
from salon.kvstore.radix_tree import RadixTree
from salon.loadgen.alternation import alternated_pairs, describe, paired_ratio

DIALOGUE_BLOCKS = 200


def full_collection_ms() -> float:
    start = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - start) * 1e3


def tracked_objects() -> int:
    gc.collect()  # also untracks the tuples and dicts that hold only untracked objects
    return len(gc.get_objects())


def build_tree(blocks: int):
    """A kvstore radix tree of `blocks` stored blocks."""
    tree = RadixTree(capacity_bytes=2 * blocks * 64)
    ns = tree.get_or_create_namespace(b"bench", KVLayout(16, 64, 64, 512))
    made = 0
    while made < blocks:
        dialogue, parent = made // DIALOGUE_BLOCKS, ns.root
        for block in range(min(DIALOGUE_BLOCKS, blocks - made)):
            key = struct.pack("<16I", dialogue, block, *range(14))
            parent = tree.insert(parent, key, tree.allocate(64), tree.allocate(64), f"conversation-{dialogue}")
            tree.add_owner(parent, "character-definition")
        made += DIALOGUE_BLOCKS
    return tree


def kvstore_section(result: dict, blocks: int, rounds: int) -> None:
    gc.collect()
    gc.freeze()  # the process's own heap: the same in both measurements
    try:
        before = tracked_objects()
        tree = build_tree(blocks)
        result["kvstore_tracked_objects_per_block"] = round((tracked_objects() - before) / blocks, 3)
        del tree

        def with_tree() -> float:
            tree = build_tree(blocks)
            ms = full_collection_ms()
            del tree
            gc.collect()  # its cycles (a node and its parent's children), not left to the next measurement
            return ms

        ratio = paired_ratio(alternated_pairs(with_tree, full_collection_ms, rounds), ("with_tree", "without"))
    finally:
        gc.unfreeze()
    result["kvstore_blocks"] = blocks
    result["kvstore_full_collection_with_tree_over_without_x"] = ratio
    added = ratio["with_tree_median"] - ratio["without_median"]
    result["kvstore_pause_ms_per_100k_blocks"] = round(added * 100_000 / blocks, 2)
    print(
        f"kvstore: {blocks} blocks, {result['kvstore_tracked_objects_per_block']} tracked objects a block; "
        f"full collection {ratio['with_tree_median']:.2f} ms with the tree, {ratio['without_median']:.2f} ms "
        f"without: {result['kvstore_pause_ms_per_100k_blocks']} ms per 100,000 blocks"
    )
    print(describe("kvstore full collection, with the tree over without", ratio))


def engine_section(result: dict, model_name: str, rounds: int) -> None:
    from salon.engine.model import load_model

    loaded = load_model(model_name, precision="int8", progress=False)
    gc.collect()
    result["engine_model"] = model_name
    result["engine_tracked_objects"] = len(gc.get_objects())

    def frozen() -> float:
        gc.freeze()
        try:
            return full_collection_ms()
        finally:
            gc.unfreeze()

    ratio = paired_ratio(alternated_pairs(full_collection_ms, frozen, rounds), ("unfrozen", "frozen"), digits=1)
    result["engine_full_collection_unfrozen_over_frozen_x"] = ratio
    print(
        f"engine ({model_name}, {result['engine_tracked_objects']} tracked objects): full collection "
        f"{ratio['unfrozen_median']:.2f} ms with the start-up heap in the generations, "
        f"{ratio['frozen_median']:.4f} ms with it frozen"
    )
    print(describe("engine full collection, unfrozen over frozen", ratio))
    del loaded


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 rounds, 20,000 blocks")
    parser.add_argument("--model", default="gemma-3-270m")
    parser.add_argument("--blocks", type=int, default=None, help="kvstore blocks (default 100,000; --quick 20,000)")
    parser.add_argument("--rounds", type=int, default=None, help="alternated rounds (default 7; --quick 3)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 7)
    blocks = args.blocks or (20_000 if args.quick else 100_000)
    result: dict = {"rounds": rounds, "peer": None}
    kvstore_section(result, blocks, rounds)
    engine_section(result, args.model, rounds)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
