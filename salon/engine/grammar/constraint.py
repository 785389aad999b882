"""What a reply's text must match: one constraint per request, checked for size (and a schema for its shape,
salon/common/schema_shape.py) before anything compiles."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

from salon.common.errors import InvalidArgument
from salon.common.schema_shape import MAX_SCHEMA_DEPTH, schema_shape_problem

MAX_SCHEMA_BYTES = 65_536
MAX_GRAMMAR_BYTES = 65_536
MAX_REGEX_BYTES = 8_192
MAX_CHOICES = 1_024
MAX_CHOICE_BYTES = 1_024


class ConstraintKind(enum.Enum):
    JSON_OBJECT = "json_object"  # any JSON object
    JSON_SCHEMA = "json_schema"  # text: the schema as JSON text
    REGEX = "regex"  # text: a regular expression the whole reply matches
    GRAMMAR = "grammar"  # text: GBNF (xgrammar's EBNF) with a `root` rule, or Lark (lark.py)
    CHOICE = "choice"  # choices: the reply is exactly one of them


@dataclass(frozen=True)
class Constraint:
    """Hashable: the compiled-grammar cache's key (with the tokenizer the cache belongs to)."""

    kind: ConstraintKind
    text: str = ""
    # JSON schema only: OpenAI's strict (objects take no properties beyond those listed).
    strict: bool = False
    choices: tuple[str, ...] = ()

    @property
    def num_bytes(self) -> int:
        return len(self.text.encode()) + sum(len(c.encode()) for c in self.choices)


def checked(constraint: Constraint, field: str = "sampling.constraint") -> Constraint:
    """The constraint, or InvalidArgument naming the field and the limit it exceeds (before any compilation)."""
    kind = constraint.kind
    size = len(constraint.text.encode())
    if kind is ConstraintKind.JSON_SCHEMA:
        if size > MAX_SCHEMA_BYTES:
            raise InvalidArgument(f"{field}.json_schema: {size} bytes is more than {MAX_SCHEMA_BYTES}")
        try:
            schema = json.loads(constraint.text)
        except ValueError as exc:
            raise InvalidArgument(f"{field}.json_schema: not valid JSON ({exc})") from None
        except RecursionError:
            raise InvalidArgument(f"{field}.json_schema: nested more than {MAX_SCHEMA_DEPTH} levels deep") from None
        if not isinstance(schema, dict | bool):
            raise InvalidArgument(f"{field}.json_schema: a schema is a JSON object, not {type(schema).__name__}")
        problem = schema_shape_problem(schema, constraint.strict)
        if problem is not None:
            raise InvalidArgument(f"{field}.json_schema: {problem}")
    elif kind is ConstraintKind.REGEX:
        if not constraint.text or size > MAX_REGEX_BYTES:
            raise InvalidArgument(f"{field}.regex: must be 1..{MAX_REGEX_BYTES} bytes")
    elif kind is ConstraintKind.GRAMMAR:
        if not constraint.text or size > MAX_GRAMMAR_BYTES:
            raise InvalidArgument(f"{field}.grammar: must be 1..{MAX_GRAMMAR_BYTES} bytes")
    elif kind is ConstraintKind.CHOICE:
        if not 1 <= len(constraint.choices) <= MAX_CHOICES:
            raise InvalidArgument(f"{field}.choice: 1..{MAX_CHOICES} choices, got {len(constraint.choices)}")
        for i, choice in enumerate(constraint.choices):
            if not 1 <= len(choice.encode()) <= MAX_CHOICE_BYTES:
                raise InvalidArgument(f"{field}.choice[{i}]: must be 1..{MAX_CHOICE_BYTES} bytes")
    return constraint
