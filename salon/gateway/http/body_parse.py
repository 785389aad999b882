"""A request body (bytes, already bounded by body_limit.py) as its pydantic model, without stalling the loop.

JSON parsing and pydantic validation hold the GIL for their whole run, so a thread would not help: a
4 MiB body of two million numbers costs a quarter of a second of C code, and pydantic builds one error
object per bad list item (seconds for a million). So:

    body <= INLINE_BODY_BYTES   parsed on the loop: a few milliseconds at worst, and every body this
                                small costs the same whatever its shape
    larger                      parsed in a worker process (one, shared, in order), which also bounds
                                the JSON's shape before validating; only a model of bounded size
                                (at most MAX_JSON_VALUES values) comes back to be unpickled

Both paths run `parse_body`: the same checks, the same answers.

    not JSON                                   400 body
    deeper than MAX_JSON_DEPTH                 400 body   (100,000 levels once raised RecursionError)
    more than MAX_JSON_VALUES values           413 body
    a lone surrogate escape in a string        400 naming the field ("\\ud800": JSON allows it, the UTF-8
                                                          that the tokenizer and protobuf take does not)
    a field the model refuses                  400 naming the field (its dotted path)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import multiprocessing
import re
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

INLINE_BODY_BYTES = 16 << 10
MAX_JSON_DEPTH = 32
# Values (numbers, strings, lists, objects, ...) in one body: a prompt of token ids up to 128k tokens
# with room to spare; four million one-digit ids would otherwise fit the 4 MiB cap.
MAX_JSON_VALUES = 1 << 18


@dataclass(frozen=True)
class BodyProblem:
    """Why a body was refused: the HTTP status, the field (dotted path or "body") and what is wrong."""

    status: int
    param: str
    message: str
    unsupported: bool = False


def parse_body(raw: bytes, model: type[BaseModel]) -> BaseModel | BodyProblem:
    """`raw` as `model`, or the first problem found."""
    try:
        value = json.loads(raw)
    except RecursionError:
        return BodyProblem(400, "body", f"JSON is nested deeper than {MAX_JSON_DEPTH} levels")
    except ValueError:
        return BodyProblem(400, "body", "is not valid JSON")
    problem = _shape_problem(value)
    if problem is not None:
        return problem
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        err = _most_specific(exc.errors(include_url=False, include_context=False, include_input=False))
        param = ".".join(str(p) for p in err["loc"] if not _is_union_member(p)) or "body"
        if err["type"] == "extra_forbidden":
            return BodyProblem(400, param, "is not a supported field", unsupported=True)
        return BodyProblem(400, param, err["msg"])
    except RecursionError:
        return BodyProblem(400, "body", f"JSON is nested deeper than {MAX_JSON_DEPTH} levels")


def _most_specific(errors: list[dict]) -> dict:
    """The error to report: of a union (prompt: text or ids), the member that got past the type check
    (a negative id is "prompt.3: ... greater than or equal to 0", not "prompt: not a string")."""
    for err in errors:
        if not err["type"].endswith(("_type", "_parsing")):
            return err
    return errors[0]


def _is_union_member(part) -> bool:
    """pydantic names the member of a union in an error's location by its type ('str', 'list[str]')."""
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "float", "bool"))


def _shape_problem(value) -> BodyProblem | None:
    """The depth, the number of values and the strings of a parsed JSON document, walked without recursion."""
    num_values = 1
    stack = [(value, 1, ())]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, dict):
            children = item.items()
        elif isinstance(item, list):
            children = enumerate(item)
        elif isinstance(item, str) and _has_surrogate(item):
            return _surrogate_problem(path)
        else:
            continue
        if not item:
            continue
        num_values += len(item)
        if num_values > MAX_JSON_VALUES:  # counted before anything is done per child
            return BodyProblem(413, "body", f"more than {MAX_JSON_VALUES} JSON values")
        if depth >= MAX_JSON_DEPTH:
            return BodyProblem(400, "body", f"JSON is nested deeper than {MAX_JSON_DEPTH} levels")
        for key, child in children:
            if isinstance(key, str) and _has_surrogate(key):
                return _surrogate_problem(path)
            if isinstance(child, (dict, list, str)):
                stack.append((child, depth + 1, (*path, key)))
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _has_surrogate(text: str) -> bool:
    """Whether `text` holds a lone surrogate (json.loads joins an escaped pair into its character)."""
    return not text.isascii() and _SURROGATE.search(text) is not None


def _surrogate_problem(path: tuple) -> BodyProblem:
    return BodyProblem(
        400, ".".join(str(p) for p in path) or "body", "is not valid Unicode text (a lone surrogate escape)"
    )


def _warm() -> None:
    """Runs in the worker once, so the first large body finds it started and its imports done."""


class BodyParser:
    """Parses bodies inline or in the worker process (started at once, restarted if it dies)."""

    def __init__(self) -> None:
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def start(self) -> None:
        # spawn, not fork: the gateway runs grpc's threads, which a forked child must not inherit.
        self._pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        self._pool.submit(_warm)

    async def parse(self, raw: bytes, model: type[BaseModel]) -> BaseModel | BodyProblem:
        if len(raw) <= INLINE_BODY_BYTES:
            return parse_body(raw, model)
        if self._pool is None:
            self.start()
        pool = self._pool
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, parse_body, raw, model)
        except BrokenProcessPool:
            if self._pool is pool:
                pool.shutdown(wait=False)
                self.start()
            return BodyProblem(503, "body", "the parser restarted; retry")

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
