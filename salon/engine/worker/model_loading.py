"""Getting a runnable model for a model name, with the kernels of the engine's device, on that device."""

from __future__ import annotations

import torch

from salon.kernels.backend import select_ops


def load_model(
    name: str, precision: str = "int8", device: str = "cpu", kernels: str = "auto", activations: str = "auto"
):
    """(CausalLM, Tokenizer): the model built with the `kernels` op family for `device` and its int8 Linears'
    `activations` recipe (salon.kernels.backend.select_ops; auto: the architecture's where it has one, else the
    family's: salon.engine.model.activation_recipe), every tensor it holds on `device`."""
    loaded = load_serving_model(name, precision, device, kernels, activations)
    return loaded.model, loaded.tokenizer


def load_serving_model(
    name: str, precision: str = "int8", device: str = "cpu", kernels: str = "auto", activations: str = "auto"
):
    """The model with its tokenizer and chat renderer (salon.engine.model.loader.LoadedModel); weights are
    converted and loaded on the host, then moved to `device` once."""
    from salon.engine.model.loader import load
    from salon.engine.model.placement import place

    loaded = load(name, precision=precision, kernel_ops=select_ops(device, kernels, activations))
    if torch.device(device).type != "cpu":
        place(loaded.model, device)
    return loaded
