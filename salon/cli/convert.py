"""`salon convert`: convert the GGUF of the default model to the cached int8 checkpoint (done once)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from salon.engine.model import main_convert

    return main_convert(argv)
