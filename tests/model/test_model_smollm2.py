"""SmolLM2-135M-Instruct (llama architecture, byte-level BPE, ChatML) against llama.cpp's reference data.

Tokenizer: exact on every reference vector, special parsing on and off. float32: greedy tokens equal up to
the first step whose reference margin < 0.1, top-5 log-probs within 0.02 (the GGUF's q/k rows are
un-permuted at load; a wrong permutation is off by whole nats). int8 (W8A8 + int8 KV): teacher-forced top-1
agreement with float32 >= 95%, perplexity on gpl-3.txt within 2% of float32.
"""

import pytest
import torch

from salon.engine.model import DenseAttention, IncrementalDetokenizer
from salon.engine.model.perplexity import perplexity
from tests.model.conftest import reference_path, smollm_reference


def test_config_comes_from_the_file(smollm_fp32):
    cfg = smollm_fp32.model.config
    assert (cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == ("llama", 30, 9, 3, 64)
    assert (cfg.d_model, cfg.ffn_dim, cfg.vocab_size, cfg.max_context_tokens) == (576, 1536, 49152, 8192)
    assert all(s.attention == "global" and s.rope_base == 100000.0 for s in cfg.layers)
    assert cfg.eos_token_ids == (0, 2) and not cfg.add_bos and cfg.tied_embeddings
    assert cfg.activation == "silu" and not cfg.qk_norm and cfg.embedding_multiplier == 1.0
    assert cfg.attn_scale == 1 / 8


def test_tokenizer_exact_on_every_reference_vector(smollm_fp32):
    tok = smollm_fp32.tokenizer
    vectors = smollm_reference("tokenize.jsonl")
    assert len(vectors) == 50
    assert {v["parse_special"] for v in vectors} == {True, False}
    for rec in vectors:
        ids = tok.encode(rec["text"], add_bos=rec["add_bos"], parse_special=rec["parse_special"])
        assert ids == rec["ids"], (rec["text"], rec["parse_special"])
        assert tok.decode(ids) == rec["text"]


@pytest.mark.parametrize("text", ["I love 🍕!", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ᚠᛇᚻ \x07bell", "Café 東京 naïve", "Привет мир"])
def test_incremental_detokenizer_never_breaks_utf8(smollm_fp32, text):
    tok = smollm_fp32.tokenizer
    ids = tok.encode(text, parse_special=True)
    assert any("\ufffd" in tok.decode([i]) for i in ids) or text.isascii()  # pieces that end inside a character
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.feed(i) for i in ids] + [detok.flush()]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


def _teacher_forced_logprobs(model, rec, kv_int8=False):
    ids = rec["prompt_ids"] + rec["generated_ids"]
    attn = DenseAttention(model.config, kv_int8=kv_int8)
    hidden = model.forward(torch.tensor(ids), attn.begin_step([len(ids)]), attn)
    p, steps = len(rec["prompt_ids"]), len(rec["generated_ids"])
    return torch.log_softmax(model.logits(hidden[p - 1 : p - 1 + steps]).double(), dim=-1)


@pytest.fixture(scope="module")
def greedy_refs():
    return smollm_reference("greedy_f32.jsonl")


@pytest.fixture(scope="module")
def fp32_logprobs(smollm_fp32, greedy_refs):
    return [_teacher_forced_logprobs(smollm_fp32.model, rec) for rec in greedy_refs]


def test_fp32_greedy_and_top5_logprobs(fp32_logprobs, greedy_refs):
    assert len(greedy_refs) == 9 and max(len(r["prompt_ids"]) for r in greedy_refs) > 512
    worst, checked = 0.0, 0
    for rec, lp in zip(greedy_refs, fp32_logprobs):
        for s, step in enumerate(rec["steps"]):
            for entry in step["top5"]:
                err = abs(lp[s, entry["id"]].item() - entry["logprob"])
                worst = max(worst, err)
                assert err < 0.02, (rec["prompt"][:40], s, entry)
            if step["margin_top1_top2"] < 0.1:
                break
            assert lp[s].argmax().item() == rec["generated_ids"][s], (rec["prompt"][:40], s)
            checked += 1
    print(f"fp32: {checked} greedy steps exact, worst top-5 logprob error {worst:.4f}")
    assert checked >= 100


def test_int8_teacher_forced_agreement(smollm_int8, fp32_logprobs, greedy_refs):
    assert smollm_int8.model.precision == "int8"
    agree = total = 0
    errs = []
    for rec, ref in zip(greedy_refs, fp32_logprobs):
        lp = _teacher_forced_logprobs(smollm_int8.model, rec, kv_int8=True)
        agree += (lp.argmax(-1) == ref.argmax(-1)).sum().item()
        total += lp.shape[0]
        chosen = ref.argmax(-1)
        errs.append((lp.gather(1, chosen[:, None]) - ref.gather(1, chosen[:, None])).abs().squeeze(1))
    err = torch.cat(errs)
    print(
        f"int8 top-1 agreement {agree}/{total} = {agree / total:.4f}; "
        f"logprob error of the fp32 top-1 mean {err.mean():.3f} max {err.max():.3f}"
    )
    assert agree / total >= 0.95


@pytest.fixture(scope="module")
def gpl_ids(smollm_fp32):
    ids = smollm_fp32.tokenizer.encode(reference_path("gpl-3.txt").read_text(), parse_special=False)
    assert (
        ids[0] != smollm_fp32.tokenizer.bos_token_id
    )  # SmolLM adds no BOS; llama-perplexity then keeps chunks as they are
    return ids


@pytest.fixture(scope="module")
def fp32_perplexity(smollm_fp32, gpl_ids):
    return perplexity(smollm_fp32.model, gpl_ids, bos_token_id=None)


def test_fp32_perplexity_scores_the_whole_file(fp32_perplexity):
    print(f"gpl-3 perplexity, fp32: {fp32_perplexity.ppl:.4f} over {fp32_perplexity.num_scored_tokens} tokens")
    assert fp32_perplexity.num_scored_tokens == 3570  # 14 chunks of 512, second halves scored


@pytest.mark.timeout(1800)
def test_int8_perplexity_within_2_percent_of_fp32(smollm_int8, fp32_perplexity, gpl_ids):
    int8 = perplexity(smollm_int8.model, gpl_ids, bos_token_id=None, kv_int8=True)
    print(
        f"gpl-3 perplexity: fp32 {fp32_perplexity.ppl:.4f}, int8 (W8A8 + int8 KV) {int8.ppl:.4f} "
        f"({100 * (int8.ppl / fp32_perplexity.ppl - 1):+.2f}%)"
    )
    assert int8.num_scored_tokens == fp32_perplexity.num_scored_tokens
    assert abs(int8.ppl / fp32_perplexity.ppl - 1) < 0.02
