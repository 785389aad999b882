"""A conversion's progress as console lines: the share of its tensor work done, a line per ~10%.

Every weight tensor is read (dequantized from the GGUF) once and quantized once, so the work is 2 x the
number of tensors; calibration runs between the two halves and gets a line of its own:

    convert smollm2-135m-instruct to int8: 10% of tensors (reading the GGUF)
    ...
    convert smollm2-135m-instruct to int8: 50% of tensors (calibrating)
    convert smollm2-135m-instruct to int8: 60% of tensors (quantizing)
    ...
    convert smollm2-135m-instruct to int8: done in 48 s

Lines go to stdout: under `salon up` the engine's stdout is shown on salon up's console.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import TextIO

STEP_PERCENT = 10


class ConvertProgress:
    def __init__(self, model_id: str, num_tensors: int, out: TextIO | None = None) -> None:
        self.model_id = model_id
        self.names: list[str] = []  # the weights' names, once read
        self.total = 2 * max(1, num_tensors)
        self.done = 0
        self.out = out
        self._shown = 0  # the last percent printed
        self._started_s = time.monotonic()

    def _print(self, text: str) -> None:
        print(f"convert {self.model_id} to int8: {text}", file=self.out or sys.stdout, flush=True)

    def _advance(self, count: int, stage: str) -> None:
        self.done = min(self.total, self.done + count)
        percent = 100 * self.done // self.total
        if percent >= self._shown + STEP_PERCENT and percent < 100:
            self._shown = percent - percent % STEP_PERCENT
            self._print(f"{self._shown}% of tensors ({stage})")

    def read(self) -> None:
        """One tensor read from the GGUF."""
        self._advance(1, "reading the GGUF")

    def calibrating(self, weight_names: Iterable[str]) -> None:
        """Every tensor is read (`weight_names`: the checkpoint's names for them); calibration starts."""
        self.names = list(weight_names)
        self.total = self.done + len(self.names)
        self._print(f"{100 * self.done // self.total}% of tensors (calibrating)")

    def quantized(self, part: str) -> None:
        """A part quantized: "output" (every tensor outside the layers) or "layers.{i}." (layer i's)."""
        if part == "output":
            count = sum(not n.startswith("layers.") for n in self.names)
        else:
            count = sum(n.startswith(part) for n in self.names)
        self._advance(count, "quantizing")

    def finished(self) -> None:
        self._print(f"done in {time.monotonic() - self._started_s:.0f} s")
