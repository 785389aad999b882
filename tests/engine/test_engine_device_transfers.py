"""What a step moves between host and device, and where the model's tensors live.

A GPU step must not synchronize the device per layer or per request. Here (no GPU) the engine runs the
GPU op family (Triton, interpreted) on CPU tensors, and a TorchFunctionMode counts every call that would
be a host<->device transfer or synchronization on a GPU (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`,
`bool()` / `int()` / `float()` of a tensor), made by the engine's own code (salon/, not the
interpreter's internals). The budget per step: the batch metadata in one copy (StepBuffers.move_in,
called once) and the sampled ids out in one `.tolist()`.

Placement walks the built model and moves every tensor once, keeping shared tensors shared; checked on the
`meta` device, which no code path here would reach by accident.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from salon.engine.model.placement import place, tensors
from salon.engine.worker import device_sampler
from salon.engine.worker.device_sampler import DeviceSampler
from salon.engine.worker.model_loading import load_model
from salon.engine.worker.step_buffers import StepBuffers
from tests.engine_testlib import make_core, make_request

REPO = Path(__file__).resolve().parents[2]
OWN_CODE = (str(REPO / "salon"),)
SYNCS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__"}


class SyncCounter(TorchFunctionMode):
    """Counts (function, file:line) of sync-like tensor calls made by the engine's own code."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[tuple[str, str]] = Counter()
        # Elements of each tensor copied to the host by .tolist() / .cpu() / .numpy(), in call order.
        self.copied: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in SYNCS:
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(OWN_CODE):
                where = f"{Path(caller.f_code.co_filename).relative_to(REPO)}:{caller.f_lineno}"
                self.calls[(name, where)] += 1
                if name in ("tolist", "cpu", "numpy") and args and isinstance(args[0], torch.Tensor):
                    self.copied.append(args[0].numel())
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def triton_tiny():
    return load_model("synthetic-tiny-v4k", "int8", "cpu", kernels="triton")


def test_a_step_moves_metadata_in_once_and_ids_out_once(triton_tiny, monkeypatch):
    core = make_core(triton_tiny, kernels="triton", budget=64)
    transfers_in = []
    original = StepBuffers.move_in
    monkeypatch.setattr(
        StepBuffers, "move_in", lambda self, num_bytes: transfers_in.append(num_bytes) or original(self, num_bytes)
    )
    prompts = [[2] + [(7 * i + 13 * seed) % 4000 + 50 for i in range(n)] for n, seed in ((20, 1), (9, 2))]
    for i, prompt in enumerate(prompts):
        core.add(make_request(f"r{i}", prompt, 2))
    for kind in ("prefill", "decode"):
        transfers_in.clear()
        with SyncCounter() as counter:
            core.step()
        assert len(transfers_in) == 1, kind
        # The ids out: one .tolist() (sampler.greedy_ids, or the C argmax's result on CPU tensors).
        assert sum(counter.calls.values()) == 1 and [name for name, _ in counter.calls] == ["tolist"], (
            f"{kind} step: {dict(counter.calls)}"
        )


def test_a_step_of_penalties_sampling_and_logprobs_copies_no_logits_row(triton_tiny, monkeypatch):
    """With the device sampler, rows with penalties, sampling, log-probs and top log-probs stay on the device:
    one copy in of the batch metadata, one of the sampling parameters and count increments, and one copy out
    of the ids and the asked-for log-probs (far fewer elements than one logits row)."""
    core = make_core(triton_tiny, kernels="triton", budget=64)
    core.runner.device_sampler = DeviceSampler("cpu")
    transfers_in = []
    original_move_in = StepBuffers.move_in
    monkeypatch.setattr(
        StepBuffers,
        "move_in",
        lambda self, num_bytes: transfers_in.append(num_bytes) or original_move_in(self, num_bytes),
    )
    original = device_sampler.to_device
    monkeypatch.setattr(
        device_sampler, "to_device", lambda host, device: transfers_in.append(host) or original(host, device)
    )
    specs = [
        {"repetition_penalty": 1.2, "frequency_penalty": 0.3},
        {"temperature": 0.8, "top_p": 0.9, "min_p": 0.02, "seed": 3},
        {"temperature": 1.0, "top_k": 20, "return_logprobs": True, "num_top_logprobs": 3, "seed": 4},
        {"return_logprobs": True},
    ]
    for i, spec in enumerate(specs):
        core.add(make_request(f"r{i}", [2] + [(11 * j + 5 * i) % 4000 + 50 for j in range(9 + i)], 3, **spec))
    vocab = triton_tiny[0].config.vocab_size
    for kind in ("prefill", "decode", "decode"):
        transfers_in.clear()
        with SyncCounter() as counter:
            core.step()
        assert len(transfers_in) == 2, kind
        assert [name for name, _ in counter.calls] == ["tolist"] and sum(counter.calls.values()) == 1, (
            f"{kind} step: {dict(counter.calls)}"
        )
        # ids (4) + the chosen log-probs (2 rows) + top ids and values (2 rows x 3 each).
        assert counter.copied == [4 + 2 + 2 * 2 * 3] and counter.copied[0] < vocab, kind


def test_placement_moves_every_tensor_once_and_keeps_shared_ones_shared():
    model, _ = load_model("synthetic-tiny", "int8")
    before = list(tensors(model))
    assert before and all(t.device.type == "cpu" for _, t in before)
    shared_before = _shared_groups(before)
    moved = place(model, "meta")
    after = list(tensors(model))
    assert [p for p, _ in after] == [p for p, _ in before]
    assert all(t.device.type == "meta" for _, t in after), [p for p, t in after if t.device.type != "meta"]
    assert _shared_groups(after) == shared_before
    assert moved == len({id(t) for _, t in before})
    assert place(model, "meta") == 0  # already there: nothing moves again


def _shared_groups(named: list[tuple[str, torch.Tensor]]) -> list[list[str]]:
    """Paths that reach the same tensor object, for each tensor reached more than once."""
    groups: dict[int, list[str]] = {}
    for path, t in named:
        groups.setdefault(id(t), []).append(path)
    return sorted(g for g in groups.values() if len(g) > 1)
