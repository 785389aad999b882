"""The shipped Gemma 3 int8 model with each decoder layer of a decode-sized step as one C call
(salon.kernels.decoder_block, salon/kernels/cpu/decoder_block.h) against the same model composing every layer from its
ops, through the engine's own serving path (EngineCore: scheduler, paged int8 KV cache, sampling): the logits of
every sampled position, and the KV cache they leave, are the same bits. The steps mix chunked prefills (chunks
under and over the fused op's MAX_ROWS, so both paths fill the cache), batched decodes, contexts past the
sliding window (released blocks), device prefix hits and speculative verification rows; synthetic-tiny adds
grouped-query attention and layers that read another layer's KV; SmolLM2 (llama) has no q/k norms or
post-norms and SwiGLU. Every model runs in both activation recipes (two int8 terms,
one int16 term: salon.kernels.backend.ACTIVATION_RECIPES). Each test also checks that the fused op ran
(and, on synthetic-tiny, for the KV-sharing layers too): a test whose fused op always declined would compare
the composition with itself."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from salon.engine.model import load_model
from salon.kernels.backend import ACTIVATION_RECIPES, select_ops
from salon.kernels.cpu import decoder_block as cpu_block
from salon.kernels.cpu.linear_two_terms import MAX_ROWS
from salon.kernels.cpu.w8a8_grouped import packed_bytes, packed_weights
from salon.kernels.decoder_block import no_decoder_block, no_decoder_blocks
from tests.engine_testlib import assert_rows_equal, logits_rows, make_core, make_request, tokens

pytestmark = pytest.mark.skipif(
    cpu_block.library() is None, reason="the fused layer needs the AVX2 or AVX-512 VNNI build of the CPU kernels"
)


class Counted:
    """The CPU family's decoder_block and decoder_blocks (a step's layers in one call), counting the layers they
    took (and those that write no KV) and the calls that declined a layer."""

    def __init__(self) -> None:
        self.took = self.took_sharing = self.declined = 0

    def __call__(self, x, weights, cache, batch):
        out = cpu_block.decoder_block_cpu(x, weights, cache, batch)
        if out is None:
            self.declined += 1
        else:
            self.took += 1
            self.took_sharing += not weights.writes_kv
        return out

    def layers(self, x, layers):
        out, done = cpu_block.decoder_blocks_cpu(x, layers)
        self.declined += done < len(layers)
        self.took += done
        self.took_sharing += sum(not weights.writes_kv for weights, _, _ in layers[:done])
        return out, done


def _fused_and_composed(name: str, activations: str):
    counted = Counted()
    ops = select_ops("cpu", activations=activations)
    fused = load_model(
        name,
        "int8",
        progress=False,
        kernel_ops=dataclasses.replace(ops, decoder_block=counted, decoder_blocks=counted.layers),
    )
    composed = load_model(
        name,
        "int8",
        progress=False,
        kernel_ops=dataclasses.replace(ops, decoder_block=no_decoder_block, decoder_blocks=no_decoder_blocks),
    )
    assert all(layer.block is not None for layer in fused[0].layers)
    assert all(layer.block.int16_activations == (activations == "int16") for layer in fused[0].layers)
    assert all(layer.block.group32_activations == (activations == "group32") for layer in fused[0].layers)
    return fused, composed, counted


@pytest.fixture(scope="module", params=ACTIVATION_RECIPES)
def models(request):
    return _fused_and_composed("gemma-3-270m", request.param)


def _caches_equal(a, b) -> bool:
    return all(
        torch.equal(x, y)
        for sa, sb in zip(a.kv_cache.slots, b.kv_cache.slots)
        for x, y in zip(sa.tensors(), sb.tensors())
    )


def _compare(models, requests_of, budget: int, **core_args):
    fused, composed, counted = models
    took = counted.took
    cores = [make_core(m, budget=budget, kv_bytes=32 << 20, **core_args) for m in (fused, composed)]
    got, want = (logits_rows(core, requests_of()) for core in cores)
    assert got.keys() == want.keys()
    for rid in got:
        assert_rows_equal(got[rid], want[rid])
    assert _caches_equal(*cores)
    assert counted.took > took, "the fused layer never ran"


def test_chunked_prefills_and_batched_decodes_past_the_window_give_the_composed_bits(models):
    """Three sequences, one past the 512-token window: prefill chunks of 48 rows (fused) and the 600-token
    prompt's first chunk of more than MAX_ROWS (composed), then decodes of all three in one step."""
    assert MAX_ROWS < 100
    requests = lambda: [
        make_request("long", tokens(600, seed=1), max_new=6),  # noqa: E731
        make_request("mid", tokens(70, seed=2), max_new=8),
        make_request("short", [2, 818, 5279, 529, 7001], max_new=8),
    ]
    _compare(models, requests, budget=48)
    _compare(models, requests, budget=160, long_prefill_solo_tokens=0)  # the long prompt alone fills the budget


def test_device_prefix_hits_and_greedy_sampling_with_penalties_give_the_composed_bits(models):
    """A second turn that extends the first one's prompt starts from its cached blocks (a device hit)."""
    first = tokens(90, seed=3)
    requests = (
        lambda: [
            make_request("t1", first, max_new=5),  # noqa: E731
            make_request("t2", first + tokens(30, seed=4)[1:], max_new=5, repetition_penalty=1.2),
        ]
    )
    _compare(models, requests, budget=64)


def test_speculative_verification_rows_give_the_composed_bits(models):
    """Draft tokens from the context's n-grams are verified as extra rows of a decode step."""
    loop = [2] + [1000, 1001, 1002, 1003] * 12
    requests = lambda: [make_request("loop", loop, max_new=12), make_request("other", tokens(40, seed=5), max_new=6)]  # noqa: E731
    _compare(models, requests, budget=64, speculative_tokens=4)


@pytest.mark.parametrize("activations", ACTIVATION_RECIPES + ("group32",))
def test_grouped_query_attention_and_kv_sharing_layers_give_the_composed_bits(activations):
    """synthetic-tiny: 4 query heads over 2 KV heads, 32-token windows, layers 2 and 3 reading layers 0 and 1's KV;
    also with group32 activations (one int8 term per token and 32 channels, the CPU family's C op composed)."""
    models = _fused_and_composed("synthetic-tiny", activations)
    assert [layer.block.writes_kv for layer in models[0][0].layers] == [True, True, False, False]
    requests = lambda: [
        make_request("a", tokens(90, seed=7), max_new=10),  # noqa: E731
        make_request("b", tokens(20, seed=8), max_new=10),
    ]
    _compare(models, requests, budget=40)
    assert models[2].took_sharing > 0


@pytest.mark.parametrize("activations", ACTIVATION_RECIPES)
def test_llama_layers_give_the_composed_bits(activations):
    """SmolLM2: 9 query heads over 3 KV heads, SwiGLU, weight scales per row and 32 channels; prefill chunks and
    batched decodes of 4 sequences, every step within MAX_ROWS, so the fused op takes each one."""
    models = _fused_and_composed("smollm2-135m-instruct", activations)
    block = models[0][0].layers[0].block
    assert block.qkv_s.dim() == 2 and block.activation == "silu"
    vocab = models[0][0].config.vocab_size
    requests = lambda: [
        make_request(
            f"r{i}",
            [t % (vocab - 100) + 100 for t in tokens(30 + 9 * i, seed=20 + i)],  # noqa: E731
            max_new=8,
        )
        for i in range(4)
    ]
    _compare(models, requests, budget=MAX_ROWS)
    assert models[2].declined == 0


def test_the_fused_op_declines_what_it_does_not_take_and_leaves_x_alone(models):
    """Each step's layers go to decoder_blocks; a prefill of more rows than MAX_ROWS is declined whole (the model
    composes), decodes are taken, and x is never written. The one-layer op declines the same arguments."""
    fused, _, _ = models
    core = make_core(fused, budget=128, kv_bytes=8 << 20)
    model = fused[0]
    seen = []

    def spy(x, layers):
        before = x.clone()
        out, done = cpu_block.decoder_blocks_cpu(x, layers)
        seen.append((done, x.shape[0], torch.equal(x, before)))
        if x.shape[0] <= MAX_ROWS:  # what it declines besides the row count
            weights, cache, batch = layers[0]
            assert cpu_block.decoder_blocks_cpu(x.double(), layers)[1] == 0
            assert cpu_block.decoder_blocks_cpu(x[:, :-1], layers)[1] == 0
            assert cpu_block.decoder_block_cpu(x.double(), weights, cache, batch) is None
            assert cpu_block.decoder_block_cpu(x[:, :-1], weights, cache, batch) is None
            empty = dataclasses.replace(cache, k_scale=None)
            assert cpu_block.decoder_block_cpu(x, weights, empty, batch) is None
            assert cpu_block.decoder_blocks_cpu(x, [(weights, empty, batch), *layers[1:]])[1] == 0
        return out, done

    ops = model.kernel_ops
    model.kernel_ops = dataclasses.replace(ops, decoder_blocks=spy)
    try:
        logits_rows(core, [make_request("r", tokens(MAX_ROWS + 10, seed=6), max_new=2)])
    finally:
        model.kernel_ops = ops
    n = len(model.layers)
    assert seen[0] == (0, MAX_ROWS + 10, True)  # the prefill: more rows than the op takes
    assert seen[1:] and all(s == (n, 1, True) for s in seen[1:])  # decodes: every layer taken, x untouched


def test_the_steps_layers_in_one_call_give_one_call_per_layer_and_stop_at_the_first_declined(models):
    """decoder_blocks against decoder_block layer by layer on a decode step's real arguments: the same bits for
    all the layers, and where layer 3 is one the call does not take (a cache the Python checks refuse, or weights
    the C layer declines), the first three layers' output and n = 3. (Running a step's layers again rewrites
    their KV slots with the same values.)"""
    fused, _, _ = models
    core = make_core(fused, budget=128, kv_bytes=8 << 20)
    model = fused[0]
    checked = []

    def spy(x, layers):
        chain = [x]
        for weights, cache, batch in layers:
            chain.append(cpu_block.decoder_block_cpu(chain[-1], weights, cache, batch))
        out, done = cpu_block.decoder_blocks_cpu(x, layers)
        assert done == len(layers) and torch.equal(out, chain[-1])
        weights, cache, batch = layers[3]
        cut = [*layers[:3], (weights, dataclasses.replace(cache, k_scale=None), batch), *layers[4:]]
        out3, done3 = cpu_block.decoder_blocks_cpu(x, cut)
        assert done3 == 3 and torch.equal(out3, chain[3])
        # the C call's own stop: layer 3's weights as a C struct its layer declines (int16 activations with
        # per-row scales), past the Python checks
        args = [cpu_block._layer_args(x, *layer) for layer in layers]
        declined = type(args[3][0]).from_buffer_copy(args[3][0])
        declined.int16_activations, declined.per_row_scales = 1, 1
        args[3] = (declined, *args[3][1:])
        out_c = x.clone()
        assert cpu_block._call_layers(cpu_block._entry_points()[1], args, out_c, 1) == 3
        assert torch.equal(out_c, chain[3])
        checked.append(x.shape[0])
        return out, done

    ops = model.kernel_ops
    model.kernel_ops = dataclasses.replace(ops, decoder_blocks=spy)
    try:
        logits_rows(
            core, [make_request("a", tokens(20, seed=9), max_new=3), make_request("b", tokens(12, seed=10), max_new=3)]
        )
    finally:
        model.kernel_ops = ops
    assert checked and max(checked) > 1


def test_the_vnni_serving_path_reads_packed_weights(models):
    """On an AVX-512 VNNI CPU a two-term step's layers and the output projection read the packed copies of their
    weights (salon.kernels.cpu.w8a8_grouped.packed_weights): a silent fallback to the weights as they lie would give
    the same bits at up to 1.5x the time. Each layer's C struct holds the packed weights with NULL scale pointers,
    and the tied token table is packed with float16 scales (its GGUF scales are float16 values)."""
    fused, _, _ = models
    model = fused[0]
    if cpu_block.build() != "avx512" or model.layers[0].block.int16_activations:
        pytest.skip("packed weights are the VNNI two-term recipe's")
    core = make_core(fused, budget=64, kv_bytes=32 << 20)
    logits_rows(core, [make_request("p", tokens(20, seed=9), max_new=2)])
    for layer in model.layers:
        struct = cpu_block._structs[layer.block]
        for lin in ("qkv", "o", "gate_up", "down"):
            packed = packed_weights(getattr(layer.block, f"{lin}_w"), getattr(layer.block, f"{lin}_s"))
            assert getattr(struct, f"{lin}_s") is None and getattr(struct, f"{lin}_w") == packed.data_ptr()
    lm = model.lm_head
    table = packed_weights(lm.w_q, lm.w_scale)
    assert table is not None and table[8:16].view(torch.int64).item() == 2  # the header's scale bytes
    assert packed_bytes() >= table.numel()
