"""Shared, module-scoped model fixtures: each model is built once per test session."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.requirements import missing

# The numerics of each activation recipe of the int8 Gemma (group32: on the decoder layers' four Linears).
GEMMA_NUMERICS = {"group32": "int8-a8g32:down,gate_up,o,qkv;rescored:lm_head", "two_terms": "int8", "int16": "int8-a16"}


def gemma_served_activations() -> str:
    """What the engine serves Gemma 3 with when no recipe is named: group32 where the CPU family would serve two
    int8 terms (VNNI), its own pick otherwise (int16 on AVX2, faster there)."""
    from salon.kernels.backend import select_ops

    family = select_ops("cpu").activations
    return "group32" if family == "two_terms" else family


def gemma_served_numerics() -> str:
    return GEMMA_NUMERICS[gemma_served_activations()]


REFERENCE_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "reference"


def reference_dirs() -> tuple[Path, ...]:
    """Where the reference data is looked for: $SALON_REFERENCE_DIR alone when set (a run that must behave as
    on a machine without the data points it nowhere), else ../shared/reference then shared/reference."""
    if os.environ.get("SALON_REFERENCE_DIR"):
        return (Path(os.environ["SALON_REFERENCE_DIR"]),)
    return REFERENCE_DIR, Path(__file__).resolve().parents[2] / "shared" / "reference"


def reference_path(name: str) -> Path:
    for base in reference_dirs():
        if (base / name).exists():
            return base / name
    missing(f"reference file {name}", "the reference data lives in ../shared/reference")


@pytest.fixture(scope="session")
def greedy_refs() -> list[dict]:
    return [json.loads(line) for line in reference_path("greedy_ref_f64.jsonl").read_text().splitlines() if line]


@pytest.fixture(scope="session")
def fp32_model():
    from salon.engine.model import load_model

    torch.manual_seed(0)
    return load_model("gemma-3-270m", precision="float32", progress=False)


@pytest.fixture(scope="session")
def int8_model():
    """The shipped checkpoint as the engine serves it by default: group32 activations (one int8 term per token and
    32 channels in the decoder layers' Linears, two terms on the output projection; salon.engine.model.
    activation_recipe)."""
    from salon.engine.model import load_model

    return load_model("gemma-3-270m", precision="int8", progress=False)


@pytest.fixture(scope="session")
def int8_family_model():
    """The shipped checkpoint in the CPU family's own activation recipe, named (two int8 terms on AVX-512 VNNI, one
    int16 term on AVX2): what Gemma served before group32."""
    from salon.engine.model import load_model
    from salon.kernels.backend import select_ops

    family = select_ops("cpu").activations
    return load_model(
        "gemma-3-270m", precision="int8", kernel_ops=select_ops("cpu", activations=family), progress=False
    )


@pytest.fixture(scope="session")
def tokenizer(int8_model):
    return int8_model[1]


SMOLLM = "smollm2-135m-instruct"


def smollm_reference(name: str) -> list[dict]:
    path = reference_path(f"{SMOLLM}/{name}")
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.fixture(scope="session")
def smollm_fp32():
    from salon.engine.model import load

    return load(SMOLLM, precision="float32", progress=False)


@pytest.fixture(scope="session")
def smollm_int8():
    from salon.engine.model import load

    return load(SMOLLM, precision="int8", progress=False)


@pytest.fixture(scope="session")
def smollm_int8_group32():
    from salon.engine.model import load
    from salon.kernels.backend import select_ops

    return load(SMOLLM, precision="int8", kernel_ops=select_ops("cpu", activations="group32"), progress=False)
