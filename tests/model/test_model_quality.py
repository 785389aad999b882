"""Quality gates of the real model against the float64 reference data.

float32 path: greedy tokens equal up to the first step whose reference margin < 0.1, top-5
log-probs within 0.02; perplexity on gpl-3.txt (llama-perplexity -c 512) within 0.5% of 13.829.
int8 path (W8A8 + int8 KV, the shipped recipe) as the engine serves it by default, with group32 activations (the
decoder layers' Linears; the output projection two terms: salon.engine.model.activation_recipe), and with the CPU
family's own activation recipe named (two_terms on AVX-512 VNNI, int16 on AVX2; the AVX2 gates measured with
SALON_CPU_ISA=avx2): perplexity, teacher-forced top-1 agreement with float32 and the mean |log-prob error| of
float32's top-1, each gated at its measured value plus a small margin. Gates that tight catch a KV quantiser that
truncates instead of rounding and a down projection with one activation term instead of two (docs/testing.md has
their figures); bench/quant_eval.py has the figures of every variant.
"""

import json

import pytest
import torch

from salon.engine.model import DenseAttention
from salon.engine.model.perplexity import perplexity
from tests.model.conftest import gemma_served_numerics, reference_path
from tests.model.int8_gates import Int8Gates

REF_PPL = 13.829072782896715
NUM_TEACHER_FORCED_STEPS = 229


# model.numerics -> gates: "int8" is the two_terms activation recipe (AVX-512 VNNI), "int8-a16" the int16 one (AVX2;
# measured with SALON_CPU_ISA=avx2), "int8-a8g32:..." the group32 one, served by default (models/gemma3.py
# INT8_GROUP32_RECIPE, the output projection rescored: INT8_GROUP32_RESCORED; its perplexity is bench/quant_eval.py's
# row of the same recipe, +0.157% of REF_PPL).
INT8_GATES = {
    "int8": Int8Gates(ppl=13.8150, agreeing_steps=226, mean_logprob_error=0.01653),
    "int8-a16": Int8Gates(ppl=13.8306, agreeing_steps=227, mean_logprob_error=0.01849),
    "int8-a8g32:down,gate_up,o,qkv;rescored:lm_head": Int8Gates(
        ppl=13.8507, agreeing_steps=224, mean_logprob_error=0.02494
    ),
}
# The perplexity gate: within +0.3% of the float64 reference.
MAX_PPL_RATIO = 1.003


@pytest.fixture(scope="module", params=["served", "family"])
def int8_recipe_model(request):
    """The shipped checkpoint as the engine serves it (group32 activations on VNNI), and in the CPU family's own
    recipe."""
    if request.param == "family":
        return request.getfixturevalue("int8_family_model")
    model = request.getfixturevalue("int8_model")
    assert model[0].numerics == gemma_served_numerics()
    return model


def _teacher_forced_logprobs(model, rec, kv_int8=False):
    ids = rec["prompt_ids"] + rec["generated_ids"]
    attn = DenseAttention(model.config, kv_int8=kv_int8)
    hidden = model.forward(torch.tensor(ids), attn.begin_step([len(ids)]), attn)
    p = len(rec["prompt_ids"])
    steps = len(rec["generated_ids"])
    return torch.log_softmax(model.logits(hidden[p - 1 : p - 1 + steps]).double(), dim=-1)


@pytest.fixture(scope="module")
def fp32_logprobs(fp32_model, greedy_refs):
    return [_teacher_forced_logprobs(fp32_model[0], rec) for rec in greedy_refs]


def test_fp32_greedy_and_top5_logprobs(fp32_logprobs, greedy_refs):
    assert len(greedy_refs) == 8
    assert max(len(r["prompt_ids"]) for r in greedy_refs) > 512  # crosses the sliding window
    worst = 0.0
    for rec, lp in zip(greedy_refs, fp32_logprobs):
        for s, step in enumerate(rec["steps"]):
            for entry in step["top5"]:
                err = abs(lp[s, entry["id"]].item() - entry["logprob"])
                worst = max(worst, err)
                assert err < 0.02, (rec["prompt"][:40], s, entry)
            if step["margin_top1_top2"] < 0.1:
                break
            assert lp[s].argmax().item() == rec["generated_ids"][s], (rec["prompt"][:40], s)
    print(f"fp32 worst top-5 logprob error {worst:.2e}")


def test_int8_teacher_forced_agreement(int8_recipe_model, fp32_logprobs, greedy_refs):
    int8_model = int8_recipe_model
    agree = total = 0
    errs = []
    for rec, ref in zip(greedy_refs, fp32_logprobs):
        lp = _teacher_forced_logprobs(int8_model[0], rec, kv_int8=True)
        agree += (lp.argmax(-1) == ref.argmax(-1)).sum().item()
        total += lp.shape[0]
        chosen = ref.argmax(-1)
        errs.append((lp.gather(1, chosen[:, None]) - ref.gather(1, chosen[:, None])).abs().squeeze(1))
    err = torch.cat(errs)
    gates = INT8_GATES[int8_model[0].numerics]
    print(
        f"{int8_model[0].numerics} top-1 agreement {agree}/{total} = {agree / total:.4f}; "
        f"logprob error of the fp32 top-1 mean {err.mean():.5f} max {err.max():.4f}"
    )
    assert total == NUM_TEACHER_FORCED_STEPS
    assert agree >= gates.min_agreeing_steps
    assert err.mean().item() <= gates.max_mean_logprob_error


@pytest.fixture(scope="module")
def gpl_ids(tokenizer):
    ids = tokenizer.encode(reference_path("gpl-3.txt").read_text(), add_bos=True, parse_special=False)
    expected = json.loads(reference_path("perplexity.json").read_text())["tokens_in_file_with_bos"]
    assert len(ids) == expected
    return ids


def test_fp32_perplexity(fp32_model, gpl_ids):
    result = perplexity(fp32_model[0], gpl_ids, bos_token_id=2)
    print(f"fp32 ppl {result.ppl:.4f} ({100 * (result.ppl / REF_PPL - 1):+.3f}%)")
    assert result.num_scored_tokens == 3570
    assert abs(result.ppl / REF_PPL - 1) < 0.005


def test_int8_perplexity(int8_recipe_model, gpl_ids):
    result = perplexity(int8_recipe_model[0], gpl_ids, bos_token_id=2, kv_int8=True)
    numerics = int8_recipe_model[0].numerics
    print(f"{numerics} (W8A8 + int8 KV) ppl {result.ppl:.5f} ({100 * (result.ppl / REF_PPL - 1):+.3f}%)")
    assert result.num_scored_tokens == 3570
    assert result.ppl <= INT8_GATES[numerics].max_ppl
    assert result.ppl <= REF_PPL * MAX_PPL_RATIO
