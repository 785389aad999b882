"""Getting a runnable model for a model name, with the kernels of the engine's device."""

from __future__ import annotations

from kernels.backend import select_ops


def load_model(name: str, precision: str = "int8", device: str = "cpu"):
    """(CausalLM, Tokenizer)."""
    from services.engine.model import load_model as load

    return load(name, precision=precision, kernel_ops=select_ops(device))


def load_serving_model(name: str, precision: str = "int8", device: str = "cpu"):
    """The model with its tokenizer and chat renderer (services.engine.model.loader.LoadedModel)."""
    from services.engine.model.loader import load

    return load(name, precision=precision, kernel_ops=select_ops(device))
