"""Putting a built model on the engine's device: every tensor it holds, once, shared tensors kept shared.

The architectures build their layers from plain objects holding tensors (no nn.Module), so placement walks
those objects (their attributes, lists, tuples and dicts) and replaces each tensor by its copy on the device.
A tensor reachable twice (the tied embedding table that is also the output projection) is moved once and
stays one tensor. Kernel functions and the model config are not walked.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

# Objects of these modules are walked; anything else (functions, Ops, configs, numbers) is left alone.
_WALKED_MODULE_PREFIX = "salon.engine.model"


def _walked(value: object) -> bool:
    return type(value).__module__.startswith(_WALKED_MODULE_PREFIX) and hasattr(value, "__dict__")


def place(model: object, device: torch.device | str) -> int:
    """Move every tensor `model` holds to `device` in place; returns how many tensors were moved."""
    device = torch.device(device)
    moved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (source kept alive, copy)

    def convert(value):
        if isinstance(value, torch.Tensor):
            if value.device == device:
                return value
            key = id(value)
            if key not in moved:
                moved[key] = (value, value.to(device))
            return moved[key][1]
        if isinstance(value, list):
            value[:] = [convert(v) for v in value]
            return value
        if isinstance(value, tuple):
            items = [convert(v) for v in value]
            if all(a is b for a, b in zip(items, value)):
                return value
            return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
        if isinstance(value, dict):
            for k in list(value):
                value[k] = convert(value[k])
            return value
        if _walked(value) and id(value) not in seen:
            seen.add(id(value))
            for name, attr in list(vars(value).items()):
                new = convert(attr)
                if new is not attr:  # (frozen configs hold no tensors: never assigned)
                    setattr(value, name, new)
        return value

    seen: set[int] = set()
    convert(model)
    return len(moved)


def tensors(model: object) -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor `model` holds (each object walked once)."""
    seen: set[int] = set()

    def walk(value, path: str):
        if isinstance(value, torch.Tensor):
            yield path, value
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                yield from walk(v, f"{path}[{i}]")
        elif isinstance(value, dict):
            for k, v in value.items():
                yield from walk(v, f"{path}[{k!r}]")
        elif _walked(value) and id(value) not in seen:
            seen.add(id(value))
            for name, attr in vars(value).items():
                yield from walk(attr, f"{path}.{name}")

    yield from walk(model, "model")
