"""The activation recipe a model serves with (salon.engine.model.activation_recipe): Gemma 3's group32 where no
recipe is named, the kernel family's pick for llama, a named recipe as it is; and the loaders apply it."""

from __future__ import annotations

import pytest

from salon.engine.model.activation_recipe import serving_activations
from salon.kernels.backend import ACTIVATION_RECIPES, REFERENCE_ACTIVATION_RECIPES, select_ops

GROUP32_NUMERICS = "int8-a8g32:down,gate_up,o,qkv"
FAMILIES = ("cpu", "ref", "triton")


@pytest.mark.parametrize("family", FAMILIES)
def test_gemma3_serves_group32_on_every_family(family):
    ops = select_ops("cpu", family)
    served = serving_activations("gemma3", ops)
    assert served.activations == "group32"
    assert served.name == family and served.linear_group32 is ops.linear_group32


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

    default = load_serving_model("synthetic-tiny", "int8", "cpu", "auto", "auto").model
    assert default.kernel_ops.activations == "group32" and default.numerics == GROUP32_NUMERICS
    assert all(layer.qkv.group32_activations and layer.down.group32_activations for layer in default.layers)
    assert default.lm_head.activation_terms == 2 and not default.lm_head.group32_activations
    assert load("synthetic-tiny", "int8", progress=False).model.numerics == GROUP32_NUMERICS
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
