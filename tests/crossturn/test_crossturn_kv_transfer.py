"""kv_transfer: payload sizes, and pack -> unpack into other blocks reproduces the KV exactly."""

import pytest
import torch

from salon.engine.kv.kv_cache import KVCache
from salon.engine.kv.kv_layout import BlockId, plan_layout
from salon.engine.kv.kv_transfer import GLOBAL, LOCAL, host_layout, layout_tag, pack_blocks, unpack_blocks
from salon.engine.model.config import synthetic_config
from tests.model_configs import gemma3_270m_config


def test_gemma_host_layout_sizes():
    layout = plan_layout(gemma3_270m_config(), 16, 64 * 16 * 3 * 520)
    host = host_layout(layout)
    # 3 global layers, 15 sliding; per layer per token: K 256 + V 256 int8 + two float32 scales.
    assert host.global_bytes_per_block == 3 * 16 * 520 == 24960
    assert host.local_bytes_per_block == 15 * 16 * 520 == 124800
    assert (host.block_size_tokens, host.sliding_window_tokens) == (16, 512)


def test_layout_tag_names_precision_and_groups():
    layout = plan_layout(gemma3_270m_config(), 16, 1 << 24)
    tag = layout_tag(layout, "int8", "cpu")
    assert tag.startswith("kv-int8-v1/bs16/hkv1/d256/int8/cpu/g:5,11,17;w512:0,1,2;")
    assert tag != layout_tag(layout, "float32", "cpu")


def test_each_activation_recipe_has_its_own_namespace_tag():
    """The KV an int16-activation model computes differs from the two-term model's: the engine tags its cache
    namespace with the model's numerics (salon/engine/api/bootstrap.py), so neither reads the other's KV."""
    from salon.engine.model import load_model
    from salon.kernels.backend import select_ops

    layout = plan_layout(synthetic_config("synthetic-tiny"), 4, 1 << 20)
    numerics = {
        recipe: load_model("synthetic-tiny", "int8", kernel_ops=select_ops("cpu", activations=recipe), progress=False)[
            0
        ].numerics
        for recipe in ("two_terms", "int16")
    }
    assert numerics == {"two_terms": "int8", "int16": "int8-a16"}
    assert layout_tag(layout, numerics["int16"], "cpu") != layout_tag(layout, numerics["two_terms"], "cpu")


def test_each_kernel_family_has_its_own_namespace():
    """KV computed by the CPU, Triton and reference kernels differ in bits: two engines of different families
    get different namespaces for the same tenant and model, two of the same family the same one."""
    from salon.engine.api.bootstrap import namespace_function
    from salon.engine.worker.model_loading import load_model
    from tests.engine_testlib import make_core

    model = load_model("synthetic-tiny", "int8")
    namespaces = {}
    for family in ("cpu", "triton", "ref"):
        cores = [make_core(model, kernels=family, kv_bytes=1 << 20) for _ in range(2)]
        assert cores[0].kernel_family.split("-")[0] == family
        same = {namespace_function(core)("tenant") for core in cores}
        assert len(same) == 1, family
        namespaces[family] = same.pop()
    assert len(set(namespaces.values())) == 3


def test_each_build_of_the_cpu_family_has_its_own_namespace(monkeypatch):
    """The CPU family's paged attention gives other bits on each build (AVX-512, AVX2, PyTorch): an engine
    whose attention runs another build gets another namespace, so a host's engines never share KV of
    other bits (one whose C kernels could not load, or a kvstore shared by engines on other CPUs)."""
    import dataclasses

    from salon.engine.api.bootstrap import namespace_function
    from salon.engine.core import engine_core
    from salon.engine.worker.model_loading import load_model
    from salon.kernels.cpu import paged_attention
    from tests.engine_testlib import make_core

    model = load_model("synthetic-tiny", "int8")
    here = make_core(model, kernels="cpu", kv_bytes=1 << 20)
    assert here.kernel_family == f"cpu-{paged_attention.build()}"
    select_ops = engine_core.select_ops
    namespaces = {here.kernel_family: namespace_function(here)("tenant")}
    for other_build in ("avx512", "avx2", "torch"):
        if f"cpu-{other_build}" in namespaces:
            continue
        monkeypatch.setattr(
            engine_core,
            "select_ops",
            lambda *a, b=other_build, **k: dataclasses.replace(select_ops(*a, **k), build=b),
        )
        other = make_core(model, kernels="cpu", kv_bytes=1 << 20)
        assert other.kernel_family == f"cpu-{other_build}"
        namespaces[other.kernel_family] = namespace_function(other)("tenant")
    assert len(set(namespaces.values())) == 3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pack_unpack_round_trip_into_other_blocks(seed):
    config = synthetic_config("synthetic-tiny")
    layout = plan_layout(config, 4, 40 * 2 * 2 * 4 * 2 * (16 + 4))
    cache = KVCache(layout)
    gen = torch.Generator().manual_seed(seed)
    for s in cache.slots:
        s.k_cache.copy_(torch.randint(-127, 128, s.k_cache.shape, generator=gen, dtype=torch.int8))
        s.v_cache.copy_(torch.randint(-127, 128, s.v_cache.shape, generator=gen, dtype=torch.int8))
        s.k_scale.copy_(torch.rand(s.k_scale.shape, generator=gen))
        s.v_scale.copy_(torch.rand(s.v_scale.shape, generator=gen))
    num_groups = len(layout.groups)
    src = [[BlockId(3 + g * 7 + i) for i in range(5)] for g in range(num_groups)]
    dst = [[BlockId(20 + g * 7 + i) for i in range(5)] for g in range(num_groups)]
    host = host_layout(layout)
    for part, size in ((GLOBAL, host.global_bytes_per_block), (LOCAL, host.local_bytes_per_block)):
        rows = pack_blocks(cache, src, [1, 2, 4], part)
        assert rows.shape == (3, size) and rows.dtype == torch.uint8
        unpack_blocks(cache, dst, [1, 2, 4], part, rows)
        assert torch.equal(pack_blocks(cache, dst, [1, 2, 4], part), rows)
    for g in layout.groups:
        for slot in range(len(g.layer_ids)):
            s = cache.slots[slot]
            for i in (1, 2, 4):
                a, b = src[g.group_id][i], dst[g.group_id][i]
                assert torch.equal(s.k_cache[a], s.k_cache[b]) and torch.equal(s.v_scale[a], s.v_scale[b])


def test_missing_block_and_bad_payload_are_refused():
    layout = plan_layout(synthetic_config("synthetic-tiny"), 4, 1 << 16)
    cache = KVCache(layout)
    tables = [[BlockId(0), None] for _ in layout.groups]
    with pytest.raises(ValueError, match="no block at index 1"):
        pack_blocks(cache, tables, [1], GLOBAL)
    rows = pack_blocks(cache, tables, [0], GLOBAL)
    with pytest.raises(ValueError, match="needs"):
        unpack_blocks(cache, tables, [0], GLOBAL, torch.zeros((1, rows.shape[1] + 4), dtype=torch.uint8))
