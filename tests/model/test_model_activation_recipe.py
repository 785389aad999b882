"""The activation recipe a model serves with (salon.engine.model.activation_recipe): Gemma 3's group32 in place of
the family's two terms where no recipe is named (int16 kept where the family picks it), the kernel family's pick
for llama, a named recipe as it is; and the loaders apply it."""

from __future__ import annotations

import dataclasses

import pytest

from salon.engine.model.activation_recipe import serving_activations
from salon.kernels.backend import ACTIVATION_RECIPES, REFERENCE_ACTIVATION_RECIPES, select_ops
from tests.model.conftest import GEMMA_NUMERICS, gemma_served_activations

FAMILIES = ("cpu", "ref", "triton")


@pytest.mark.parametrize("family", FAMILIES)
def test_gemma3_serves_group32_where_the_family_picks_two_terms(family):
    ops = dataclasses.replace(select_ops("cpu", family), activations="two_terms")
    served = serving_activations("gemma3", ops)
    assert served.activations == "group32"
    assert served.name == family and served.linear_group32 is ops.linear_group32


def test_gemma3_keeps_int16_where_the_family_picks_it():
    """The AVX2 build's pick (int16: faster there than group32, measured) is not replaced."""
    ops = dataclasses.replace(select_ops("cpu"), activations="int16")
    assert not ops.activations_named
    assert serving_activations("gemma3", ops).activations == "int16"


@pytest.mark.parametrize("family", FAMILIES)
def test_llama_serves_the_family_pick(family):
    ops = select_ops("cpu", family)
    assert serving_activations("llama", ops).activations == ops.activations
    assert ops.activations in ACTIVATION_RECIPES


@pytest.mark.parametrize("architecture", ("gemma3", "llama"))
@pytest.mark.parametrize("recipe", ACTIVATION_RECIPES + REFERENCE_ACTIVATION_RECIPES)
def test_a_named_recipe_is_served_as_named(architecture, recipe):
    assert serving_activations(architecture, select_ops("cpu", activations=recipe)).activations == recipe


def test_the_loader_serves_gemma3_in_group32_unless_a_recipe_is_named():
    """synthetic-tiny is a Gemma 3 model: the loaders build it with group32 Linears by default (the engine's
    load_serving_model with activations=auto, and salon.engine.model.load without kernel ops), and with the
    named recipe's otherwise; a float32 model keeps its kernel ops as they are."""
    from salon.engine.model import load
    from salon.engine.worker.model_loading import load_serving_model

    served = gemma_served_activations()  # int16 where the family picks it (AVX2)
    default = load_serving_model("synthetic-tiny", "int8", "cpu", "auto", "auto").model
    assert default.kernel_ops.activations == served and default.numerics == GEMMA_NUMERICS[served]
    if served == "group32":
        assert all(layer.qkv.group32_activations and layer.down.group32_activations for layer in default.layers)
        assert default.lm_head.activation_terms == 2 and not default.lm_head.group32_activations
    assert load("synthetic-tiny", "int8", progress=False).model.numerics == GEMMA_NUMERICS[served]
    named = load_serving_model("synthetic-tiny", "int8", "cpu", "auto", "two_terms").model
    assert named.kernel_ops.activations == "two_terms" and named.numerics == "int8"
    fp32 = load("synthetic-tiny", "float32", progress=False).model
    assert fp32.kernel_ops.activations == select_ops("cpu").activations and fp32.numerics == "float32"


@pytest.mark.model
def test_the_loader_serves_smollm2_in_the_family_pick(smollm_int8):
    family = select_ops("cpu").activations
    assert smollm_int8.model.config.architecture == "llama"
    assert smollm_int8.model.kernel_ops.activations == family
    assert smollm_int8.model.numerics == {"two_terms": "int8", "int16": "int8-a16"}[family]
