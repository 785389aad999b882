"""The engine's own serving path against the exact reference (greedy_ref_f64.jsonl).

Every reference case runs through EngineCore itself -- scheduler, chunked prefill, paged KV cache, the
CPU kernels, the sampler -- all eight batched together, each asking for the top log-probs of every
token. Greedy ids must equal the reference up to the first step whose reference margin is < 0.1 (past a
near-tie, rounding may legitimately pick the other token), and the reference's top-5 log-probs must be
matched at every step up to there:

- float32 weights with a float32 KV cache (--precision float32, the reference path): within 0.02;
- the int8 path (W8A8 + int8 KV) as the engine serves it by default, with group32 activations (one int8 term per
  token and 32 channels in the decoder layers' Linears, two terms on the output projection: salon.engine.model.
  activation_recipe), and in the kernel families' own recipes named (two int8 terms, one int16 term): the figures
  are printed, and gated loosely; teacher-forced top-1 at the issue's gate in each.

On a GPU (tests marked `gpu`, skipped without CUDA) the same cases and gates run through EngineCore on CUDA: the
Triton op family, weights and paged KV on the device.
"""

from __future__ import annotations

import pytest
import torch

from bench.quant_eval import teacher_forced_serving
from salon.kernels.backend import ACTIVATION_RECIPES, select_ops
from tests.engine_testlib import make_core, make_request
from tests.model.conftest import gemma_served_numerics

TOP = 20  # the engine reports this many (the API's most); the reference's top 5 must be among them
# Teacher-forced top-1 agreement of the shipped int8 recipe with the exact tokens: the gate, 97% of 229
# (223). Measured: 223 with group32 activations (served by default; 220 with group32 on the output projection too);
# 225 with per-32-channel weight scales, two-term activations and no projection smoothing (checkpoint v7; the float32
# path: 228); 219 for the v6 recipe (per-row scales, GPTQ on the output projection), as llama.cpp's Q4_K_M file.
TOP1_GATE = 223


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def serve(model_and_tokenizer, refs, kv_dtype, device="cpu"):
    core = make_core(model_and_tokenizer, budget=256, kv_bytes=256 << 20, kv_dtype=kv_dtype, device=device)
    requests = [
        make_request(
            f"ref{i}", rec["prompt_ids"], len(rec["generated_ids"]), max_context_tokens=32768, num_top_logprobs=TOP
        )
        for i, rec in enumerate(refs)
    ]
    tops = {r.request_id: [] for r in requests}
    for r in requests:
        core.add(r)
    while core.has_work():
        for e in core.step():
            tops[e.request_id].extend(e.top_logprobs)
    assert core.kv_manager.num_free_blocks + core.kv_manager.num_reclaimable_blocks == core.layout.num_blocks
    return [(r.output_token_ids, tops[r.request_id]) for r in requests]


def compare(refs, served):
    """Per case: (ids equal up to the first small margin, worst top-5 log-prob error there, errors)."""
    out = []
    for rec, (ids, tops) in zip(refs, served):
        worst, errors, exact = 0.0, [], True
        for s, step in enumerate(rec["steps"]):
            engine = dict(tops[s])
            for entry in step["top5"]:
                err = abs(engine[entry["id"]] - entry["logprob"]) if entry["id"] in engine else float("inf")
                errors.append(err)
                worst = max(worst, err)
            if step["margin_top1_top2"] < 0.1:
                break
            if ids[s] != rec["generated_ids"][s]:
                exact = False
                break
        out.append((exact, worst, errors))
    return out


def assert_float32_exact(fp32_model, greedy_refs, device="cpu"):
    results = compare(greedy_refs, serve(fp32_model, greedy_refs, "float32", device))
    worst = max(w for _, w, _ in results)
    print(
        f"float32 serving path ({device}): exact greedy ids {sum(e for e, _, _ in results)}/8, "
        f"worst top-5 error {worst:.4f}"
    )
    for rec, (exact, w, _) in zip(greedy_refs, results):
        assert exact, rec["prompt"][:40]
        assert w < 0.02, (rec["prompt"][:40], w)


def test_float32_serving_path_matches_the_exact_reference(fp32_model, greedy_refs):
    assert_float32_exact(fp32_model, greedy_refs)


@pytest.fixture(scope="module", params=("served", *ACTIVATION_RECIPES))
def int8_recipe_model(request):
    """The shipped int8 checkpoint as the engine serves it (group32 on VNNI), and in each family recipe, named."""
    if request.param == "served":
        model = request.getfixturevalue("int8_model")
        assert model[0].numerics == gemma_served_numerics()
        return model
    from salon.engine.model import load_model

    return load_model("gemma-3-270m", "int8", kernel_ops=select_ops("cpu", activations=request.param), progress=False)


def assert_int8_against_reference(int8_model, greedy_refs, device="cpu"):
    """The int8 serving path's greedy ids and top-5 log-probs against the reference; returns what it served."""
    served = serve(int8_model, greedy_refs, "int8", device)
    results = compare(greedy_refs, served)
    exact = sum(e for e, _, _ in results)
    errors = [x for _, _, errs in results for x in errs]
    mean = sum(errors) / len(errors)
    print(
        f"int8 serving path ({int8_model[0].kernel_ops.activations}, {device}): exact greedy ids (to the first "
        f"margin < 0.1) {exact}/8, top-5 log-prob error mean {mean:.3f} max {max(errors):.3f}"
    )
    # Measured: group32 (served) 7/8, mean 0.092, max 0.568; two int8 terms 8/8, mean 0.055, max 0.448 (0.058 and
    # 0.583 with checkpoint v7); 6/8, mean 0.209 before the issue-15 recipe work.
    assert exact >= 7
    assert mean < 0.1
    return served


def assert_teacher_forced_top1(int8_model, greedy_refs, device="cpu"):
    result = teacher_forced_serving(*int8_model, greedy_refs, "int8", device)
    count, total = result["top1_count"], result["positions"]
    print(
        f"int8 serving path ({int8_model[0].kernel_ops.activations}, {device}), teacher-forced top-1 agreement "
        f"with exact: {count}/{total} = {count / total:.3f}, log-prob error mean {result['lp_err_mean']:.3f}"
    )
    assert result["short_reuse"] == 0
    assert total == 229
    assert count >= TOP1_GATE


def test_int8_serving_path_against_the_exact_reference(int8_recipe_model, greedy_refs):
    assert_int8_against_reference(int8_recipe_model, greedy_refs)


def test_int8_serving_path_teacher_forced_top1(int8_recipe_model, greedy_refs):
    """The shipped int8 recipe's next-token choice agrees with the exact model's at (nearly) every reference step:
    per step, a request whose prompt is the case's prompt plus the exact tokens before it generates one token
    through EngineCore with paged int8 KV (bench/quant_eval.py's teacher-forced rows), each round from the
    prefix blocks the previous one left. Served (group32, models/gemma3.py INT8_GROUP32_RECIPE), measured: 223, as
    bench/quant_eval.py's variant "shipped weights, group32 but two-term lm_head"."""
    assert_teacher_forced_top1(int8_recipe_model, greedy_refs)


def load_on_gpu(precision):
    from salon.engine.worker.model_loading import load_model as load_on

    return load_on("gemma-3-270m", precision, "cuda")


@pytest.fixture(scope="module")
def gpu_int8_model():
    return load_on_gpu("int8")


@pytest.mark.gpu
@needs_cuda
def test_gpu_float32_serving_path_matches_the_exact_reference(greedy_refs):
    assert_float32_exact(load_on_gpu("float32"), greedy_refs, "cuda")


@pytest.mark.gpu
@needs_cuda
def test_gpu_int8_serving_path_against_the_exact_reference(gpu_int8_model, int8_model, greedy_refs):
    """The same gates on CUDA, and how far the GPU's top log-probs are from the CPU's same checkpoint (printed:
    both serve it with group32 activations, on other kernels with other summation orders)."""
    served = assert_int8_against_reference(gpu_int8_model, greedy_refs, "cuda")
    cpu_ops = int8_model[0].kernel_ops.activations
    on_cpu = serve(int8_model, greedy_refs, "int8")
    same_ids = sum(a[0] == b[0] for a, b in zip(served, on_cpu))
    diffs = [
        abs(dict(gs)[i] - lp)
        for (_, g), (_, c) in zip(served, on_cpu)
        for gs, cs in zip(g, c)
        for i, lp in cs
        if i in dict(gs)
    ]
    print(
        f"GPU ({gpu_int8_model[0].kernel_ops.activations}) against CPU ({cpu_ops}) int8: identical greedy ids in "
        f"{same_ids}/8 cases, top log-prob difference max {max(diffs):.3g} mean {sum(diffs) / len(diffs):.3g}"
    )


@pytest.mark.gpu
@needs_cuda
def test_gpu_int8_serving_path_teacher_forced_top1(gpu_int8_model, greedy_refs):
    assert_teacher_forced_top1(gpu_int8_model, greedy_refs, "cuda")
