"""Build a service's frozen config dataclass from command-line flags and environment variables.

Precedence: flag > environment (`<PREFIX><FIELD>` upper-case, e.g. SALON_ENGINE_PORT) > default.
Nested dataclass fields (such as `server: ServerConfig`) are flattened: the flag `--port` and the
variable `SALON_ENGINE_PORT` set `server.port`. Only `__main__` modules call this; core code
receives the finished dataclass.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _converter(tp: Any):
    """Return (converter, is_optional) for a field type annotation."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        conv, _ = _converter(inner[0])
        return conv, True
    if origin is tuple:
        item_conv, _ = _converter(args[0])
        return (lambda text: tuple(item_conv(p) for p in text.split(",") if p.strip())), False
    if tp is bool:
        return _parse_bool, False
    if tp in (int, float, str):
        return tp, False
    raise TypeError(f"unsupported config field type {tp!r}")


def _leaf_fields(cls: type, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    leaves = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            leaves.extend(_leaf_fields(tp, prefix + (f.name,)))
        else:
            leaves.append((prefix + (f.name,), f, tp))
    return leaves


def _default_of(cls: type, path: tuple[str, ...]) -> Any:
    obj: Any = cls
    for name in path[:-1]:
        field = {f.name: f for f in dataclasses.fields(obj)}[name]
        obj = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
    field = {f.name: f for f in dataclasses.fields(obj if isinstance(obj, type) else type(obj))}[path[-1]]
    if isinstance(obj, type):
        if field.default is not dataclasses.MISSING:
            return field.default
        if field.default_factory is not dataclasses.MISSING:
            return field.default_factory()
        return dataclasses.MISSING
    return getattr(obj, path[-1])


def parse_config(
    cls: type[T],
    argv: Sequence[str] | None = None,
    env_prefix: str = "SALON_",
    environ: Mapping[str, str] | None = None,
    description: str | None = None,
) -> T:
    """Parse flags (and the environment) into an instance of the frozen dataclass `cls`."""
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(description=description or (cls.__doc__ or "").strip().splitlines()[0])
    leaves = _leaf_fields(cls)
    for path, field, tp in leaves:
        name = path[-1]
        conv, _ = _converter(tp)
        help_text = field.metadata.get("help", "")
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            dest="__".join(path),
            metavar=name.upper(),
            type=conv,
            default=None,
            help=help_text,
        )
    ns = parser.parse_args(list(argv) if argv is not None else None)
    values: dict[tuple[str, ...], Any] = {}
    for path, _field, tp in leaves:
        conv, optional = _converter(tp)
        flag_value = getattr(ns, "__".join(path))
        env_key = env_prefix + path[-1].upper()
        if flag_value is not None:
            values[path] = flag_value
        elif env_key in environ and environ[env_key] != "":
            try:
                values[path] = conv(environ[env_key])
            except ValueError as exc:
                parser.error(f"environment variable {env_key}: {exc}")
        else:
            default = _default_of(cls, path)
            if default is dataclasses.MISSING:
                parser.error(f"--{path[-1].replace('_', '-')} (or {env_key}) is required")
            values[path] = default
    return _build(cls, (), values)


def _build(cls: type[T], prefix: tuple[str, ...], values: dict[tuple[str, ...], Any]) -> T:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            kwargs[f.name] = _build(tp, prefix + (f.name,), values)
        else:
            kwargs[f.name] = values[prefix + (f.name,)]
    return cls(**kwargs)


def env_names(cls: type, env_prefix: str) -> set[str]:
    """Every environment variable `parse_config(cls, env_prefix=...)` reads."""
    return {env_prefix + path[-1].upper() for path, _field, _tp in _leaf_fields(cls)}
