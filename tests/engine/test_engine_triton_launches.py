"""What a decode step launches per decoder layer on the Triton family (tests/triton_launches.py counts Triton
kernel launches and the torch ops between them), on synthetic-tiny-v4k under Triton's interpreter, in the activation
recipe it serves by default (group32) and with two int8 terms: each count is gated at the value the fused kernels
reach, so a change that adds a launch to the decode path fails here. docs/kernels.md lists the launches of a layer."""

from __future__ import annotations

import pytest

from salon.engine.worker.model_loading import load_model
from tests.engine_testlib import make_core, make_request
from tests.triton_launches import LayerLaunches

MODEL = "synthetic-tiny-v4k"
# synthetic-tiny: layers 0 and 1 write their KV, layers 2 and 3 read another layer's (the q/k norm, RoPE and KV write
# kernel runs on q alone: one launch either way)
MAX_LAUNCHES_KV_LAYER = 14
MAX_LAUNCHES_SHARING_LAYER = 14
# The GEMM kernel of each activation recipe: group32 is what this Gemma-architecture model serves by default
# (salon.engine.model.activation_recipe), two int8 terms are named
GEMM_KERNELS = {"auto": "_group32_gemm_kernel", "two_terms": "w8a8_kernel"}


@pytest.fixture(scope="module", params=tuple(GEMM_KERNELS))
def recipe(request):
    return request.param


@pytest.fixture(scope="module")
def decode_counts(recipe):
    model, tok = load_model(MODEL, "int8", "cpu", kernels="triton", activations=recipe)
    core = make_core((model, tok), kernels="triton", budget=4096, prefix_caching=False)
    core.add(make_request("r", [2, 60, 61, 62, 63], 2))
    with LayerLaunches(model) as counts:
        while core.has_work():
            counts.reset()
            core.step()  # the last step is a decode step: one row
    return counts.per_layer


def test_decode_step_launches_per_layer(decode_counts):
    assert [c.layer_idx for c in decode_counts] == [0, 1, 2, 3]
    for c in decode_counts:
        print(c.layer_idx, c.launches, dict(c.kernels), dict(c.torch_ops))
    writes_kv = {0: True, 1: True, 2: False, 3: False}
    for c in decode_counts:
        limit = MAX_LAUNCHES_KV_LAYER if writes_kv[c.layer_idx] else MAX_LAUNCHES_SHARING_LAYER
        assert c.launches <= limit, (c.layer_idx, c.launches, dict(c.kernels), dict(c.torch_ops))


def test_the_counter_sees_every_kernel_of_a_layer(decode_counts, recipe):
    """The counter is not blind: a KV-writing layer launches the q/k norm, RoPE and KV write (one kernel), its
    recipe's GEMMs (one a Linear) and the decode attention; no layer launches the separate KV write."""
    kernels = decode_counts[0].kernels
    assert kernels["_rmsnorm_rope_kv_kernel"] == 1
    assert kernels[GEMM_KERNELS[recipe]] == 4
    assert kernels["_paged_decode_split_kernel"] == 1
    assert decode_counts[2].kernels["_rmsnorm_rope_kv_kernel"] == 1
    assert all("_kv_write_kernel" not in c.kernels for c in decode_counts)
