"""Getting (CausalLM, Tokenizer) for a model name, with the kernels of the engine's device."""

from __future__ import annotations

from kernels.backend import select_ops


def load_model(name: str, precision: str = "int8", device: str = "cpu"):
    from services.engine.model import load_model as load

    return load(name, precision=precision, kernel_ops=select_ops(device))
