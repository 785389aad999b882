"""Getting (CausalLM, Tokenizer) for a model name, with the kernels of the engine's device, on that device."""

from __future__ import annotations

import torch

from kernels.backend import select_ops


def load_model(name: str, precision: str = "int8", device: str = "cpu", kernels: str = "auto"):
    """The model built with the `kernels` op family for `device` (kernels.backend.select_ops), every tensor
    it holds on `device` (weights are converted and loaded on the host, then moved once)."""
    from services.engine.model import load_model as load
    from services.engine.model.placement import place

    model, tokenizer = load(name, precision=precision, kernel_ops=select_ops(device, kernels))
    if torch.device(device).type != "cpu":
        place(model, device)
    return model, tokenizer
