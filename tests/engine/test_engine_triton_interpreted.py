"""The GPU op family end to end without a GPU: the whole engine (model layers and the paged KV path) runs
the Triton kernels on CPU tensors through Triton's interpreter (`--kernels triton`).

On that path a request's logits are bit-for-bit the same alone or batched, prefilled in one chunk or many,
and with or without a device or host cache hit. The interpreter's own tl.dot is a numpy BLAS call whose
rounding depends on how a program tile's rows are composed (a row alone vs with others: 7.6e-6 measured at 5
keys), which the kernels' design assumes away for GPUs (row-independent MMA); a difference that small still
flips int8 activation roundings downstream (a logit moved 2e-2 that way), so these tests run the
interpreter with a row-independent dot (tests/triton_interpreter.py), and check the kernels' own invariance
bit for bit. Log-probs agree with the plain PyTorch reference family within 2e-3.
synthetic-tiny-v4k only (synthetic-tiny with a 4,096-id vocabulary): the interpreter runs numpy per program
instance, slowly, and a 262,144-row output projection alone takes it seconds.
"""

from __future__ import annotations

import pytest
import torch

from salon.common.prefix_hash import namespace_digest
from salon.engine.prefix.hit import host_hit
from salon.engine.worker.model_loading import load_model
from tests.engine_testlib import BLOCK_SIZE_TOKENS as BS
from tests.engine_testlib import logits_rows, make_core, make_request
from tests.triton_interpreter import row_independent_dot

MODEL = "synthetic-tiny-v4k"
PROMPTS = [
    [2] + [(i * 7919 + seed * 104729) % 4000 + 50 for i in range(n - 1)] for n, seed in ((37, 1), (21, 2), (40, 3))
]
NEW_TOKENS = 3
NS = namespace_digest(MODEL, "triton-interpreted", "tenant")


@pytest.fixture(scope="module", autouse=True)
def rows_on_their_own():
    with pytest.MonkeyPatch.context() as mp:
        row_independent_dot(mp)
        yield


@pytest.fixture(scope="module")
def triton_tiny():
    model, tok = load_model(MODEL, "int8", "cpu", kernels="triton")
    assert model.kernel_ops.name == "triton"
    return model, tok


def triton_core(model_and_tok, **kw):
    core = make_core(model_and_tok, kernels="triton", **kw)
    assert core.runner.attention.paged_attention.__name__ == "paged_attention_triton"
    return core


def assert_same_tokens(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    """Greedy rows: the same token at every step, and the same logits, bit for bit."""
    assert len(got) == len(want) == NEW_TOKENS
    assert [int(r.argmax()) for r in got] == [int(r.argmax()) for r in want]
    for step, (a, b) in enumerate(zip(got, want)):
        diff = (a - b).abs().max().item()
        assert torch.equal(a, b), f"step {step}: logits differ by {diff:.3e}"


def request(i: int, namespace: bytes | None = None, **kw):
    return make_request(f"r{i}", PROMPTS[i], NEW_TOKENS, namespace=namespace, **kw)


@pytest.fixture(scope="module")
def alone(triton_tiny):
    """Each request alone, its prompt in one chunk, no cache."""
    return {
        f"r{i}": logits_rows(triton_core(triton_tiny, budget=4096, prefix_caching=False), [request(i)])[f"r{i}"]
        for i in range(len(PROMPTS))
    }


def test_batched_and_chunked_logits_equal_alone(triton_tiny, alone):
    rows = logits_rows(
        triton_core(triton_tiny, budget=24, prefix_caching=False), [request(i) for i in range(len(PROMPTS))]
    )
    for rid, want in alone.items():
        assert_same_tokens(rows[rid], want)


def test_device_and_host_cache_hits_keep_logits(triton_tiny, alone):
    core = triton_core(triton_tiny, budget=4096)
    puts = []
    core.set_host_sink(puts.append)
    logits_rows(core, [make_request("prefix", PROMPTS[2][: 2 * BS + 3], 1, namespace=NS)])
    device = request(2, NS)
    assert_same_tokens(logits_rows(core, [device])["r2"], alone["r2"])
    assert device.num_cached_device_tokens == 2 * BS + 3  # on into the block the prefix ended inside

    put = puts[0]
    hit = host_hit(len(put.token_ids), put.global_kv, put.local_kv, put.local_first_block)
    host = request(2, NS)
    rows = logits_rows(triton_core(triton_tiny, budget=4096), [host], {"r2": hit})
    assert host.num_cached_host_tokens == 2 * BS
    assert_same_tokens(rows["r2"], alone["r2"])


def test_logprobs_agree_with_the_reference_family(triton_tiny, alone):
    ref_model = load_model(MODEL, "int8", "cpu", kernels="ref")
    ref = logits_rows(make_core(ref_model, budget=4096, prefix_caching=False, kernels="ref"), [request(0)])["r0"]
    got = alone["r0"]
    assert len(got) == len(ref) == NEW_TOKENS
    for a, b in zip(got, ref):
        lp_a, lp_b = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
        assert int(a.argmax()) == int(b.argmax())
        assert (lp_a - lp_b).abs().max().item() < 2e-3
