"""`salon convert`: a GGUF (a known name or a path) -> its calibrated int8 checkpoint in the cache.

The command sits above both the loader (which finds the GGUF) and the checkpoint code (which converts
it), so neither of them imports the other back.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from salon.engine.model.checkpoint import ensure_checkpoint
from salon.engine.model.loader import open_model_file


def convert(
    model: str = "gemma-3-270m",
    cache_dir: Path | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Path:
    """GGUF (a known name or a path) -> calibrated int8 checkpoint in the cache (every activation recipe runs on
    it); returns its path."""
    return ensure_checkpoint(open_model_file(model, cache_dir), cache_dir, overwrite, progress)[0]


def main_convert(argv: list[str] | None = None) -> int:
    """`salon convert [--model NAME|PATH] [--cache-dir DIR] [--overwrite]`."""
    parser = argparse.ArgumentParser(prog="salon convert", description="GGUF -> cached int8 checkpoint")
    parser.add_argument("--model", default="gemma-3-270m", help="a known model name or a path to a .gguf")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    started = time.monotonic()
    path, converted = ensure_checkpoint(open_model_file(args.model, args.cache_dir), args.cache_dir, args.overwrite)
    verb = "converted" if converted else "already converted"
    print(f"{verb} {args.model} -> {path} in {time.monotonic() - started:.1f} s")
    return 0
