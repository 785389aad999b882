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
    activations: str = "two_terms",
) -> Path:
    """GGUF (a known name or a path) -> calibrated int8 checkpoint in the cache (the one the activation recipe
    `activations` runs on); returns its path."""
    return ensure_checkpoint(open_model_file(model, cache_dir), cache_dir, overwrite, progress, activations)[0]


def main_convert(argv: list[str] | None = None) -> int:
    """`salon convert [--model NAME|PATH] [--cache-dir DIR] [--overwrite] [--activations RECIPE]`."""
    parser = argparse.ArgumentParser(prog="salon convert", description="GGUF -> cached int8 checkpoint")
    parser.add_argument("--model", default="gemma-3-270m", help="a known model name or a path to a .gguf")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument(
        "--activations",
        default="two_terms",
        choices=("two_terms", "int16", "group32"),
        help="the activation recipe whose checkpoint to build (group32 has its own where the architecture's differs)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    path, converted = ensure_checkpoint(
        open_model_file(args.model, args.cache_dir), args.cache_dir, args.overwrite, activations=args.activations
    )
    verb = "converted" if converted else "already converted"
    print(f"{verb} {args.model} -> {path} in {time.monotonic() - started:.1f} s")
    return 0
