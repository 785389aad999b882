"""Grammar engines for constrained decoding, side by side: xgrammar and llguidance on the same schema and vocabularies.

For each library that is installed and each vocabulary (SmolLM2's 49,152 tokens, Gemma 3's 262,144), in one run:

    tokenizer_ms    building the library's tokenizer object from the vocabulary's token bytes (once per model)
    compile_ms      compiling the character-state schema below (enums, a nested object, an array with bounds,
                    integer bounds), strict; the best of the rounds' fresh compilations (no cache)
    matcher_ms      a request's matcher from the compiled grammar (llguidance builds its parser here)
    mask_b1_us      filling one row's token bitmask, per token, over a valid reply's tokens (fill, then accept)
    mask_b32_us     filling 32 rows' bitmasks in one step, per step, the 32 rows at staggered positions of the
                    reply (the engine fills the rows of a step one after another on one thread)

The reply is a fixed valid instance of the schema, tokenized by the engine's own tokenizer; every token of it
must be allowed by the mask (checked: a library that refuses a valid token fails the run).

With `--steps`, the engine itself (EngineCore, SmolLM2 int8, --threads threads): the mean decode step of 32
greedy rows constrained by the schema against 32 free greedy rows, the same prompts, alternated rounds, each
keeping its best (`step_ms_constrained`, `step_ms_free`, `step_constrained_over_free_x`; target <= 1.1).

    python -m bench.grammar [--quick] [--libraries xgrammar,llguidance] [--models smollm2-135m-instruct,gemma-3-270m]
                            [--steps] [--threads N]

The last line is `RESULT {json}`: per library and model the figures above; a library that is not installed has
`"error"` instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time

import torch

from salon.engine.model.loader import open_model_file
from salon.engine.model.tokenizer import Tokenizer

CHARACTER_STATE_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "mood": {"type": "string", "enum": ["calm", "cheerful", "curious", "wary", "angry", "sad"]},
        "energy": {"type": "integer", "minimum": 0, "maximum": 100},
        "location": {
            "type": "object",
            "properties": {
                "place": {"type": "string", "enum": ["home", "tavern", "forest", "market", "castle"]},
                "x": {"type": "integer", "minimum": -1000, "maximum": 1000},
                "y": {"type": "integer", "minimum": -1000, "maximum": 1000},
            },
            "required": ["place", "x", "y"],
            "additionalProperties": False,
        },
        "inventory": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"item": {"type": "string"}, "count": {"type": "integer", "minimum": 1, "maximum": 99}},
                "required": ["item", "count"],
                "additionalProperties": False,
            },
            "maxItems": 8,
        },
        "goals": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "is_hostile": {"type": "boolean"},
    },
    "required": ["name", "mood", "energy", "location", "inventory", "goals", "is_hostile"],
    "additionalProperties": False,
}

REPLY = json.dumps(
    {
        "name": "Ada Lovelace",
        "mood": "curious",
        "energy": 87,
        "location": {"place": "tavern", "x": -12, "y": 440},
        "inventory": [{"item": "lantern", "count": 1}, {"item": "silver coins", "count": 42}],
        "goals": ["find the old map", "befriend the innkeeper"],
        "is_hostile": False,
    }
)
BATCH_ROWS = 32


def vocabulary(tokenizer: Tokenizer, eos_token_ids: tuple[int, ...]) -> list[bytes]:
    """Each token's bytes; control tokens other than the stop tokens as b"" (never text)."""
    return [
        b"" if tokenizer.is_special(i) and i not in eos_token_ids else tokenizer.token_bytes(i)
        for i in range(tokenizer.vocab_size)
    ]


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer: Tokenizer, eos_token_ids: tuple[int, ...]) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo(
            vocabulary(tokenizer, eos_token_ids), xgr.VocabType.RAW, stop_token_ids=list(eos_token_ids)
        )

    def compile(self, schema: str):
        compiler = self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        return compiler.compile_json_schema(schema, strict_mode=True, any_whitespace=False)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher, bitmask: torch.Tensor, row: int) -> None:
        matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, matcher, token_id: int) -> bool:
        return matcher.accept_token(token_id)


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer: Tokenizer, eos_token_ids: tuple[int, ...]) -> None:
        import llguidance

        self.llg = llguidance
        vocab = vocabulary(tokenizer, eos_token_ids)

        class Wrapper:
            eos_token_id = eos_token_ids[0]
            bos_token_id = tokenizer.bos_token_id
            tokens = vocab
            special_token_ids = [i for i in range(tokenizer.vocab_size) if tokenizer.is_special(i)]

            def __call__(self, text: bytes) -> list[int]:
                return tokenizer.encode(text.decode("utf-8", errors="replace"), add_bos=False, parse_special=False)

        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapper()), eos_token=list(eos_token_ids))

    def compile(self, schema: str):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        )
        matcher = self.llg.LLMatcher(self.tokenizer, grammar)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        return grammar

    def matcher(self, compiled):
        return self.llg.LLMatcher(self.tokenizer, compiled)

    def fill(self, matcher, bitmask: torch.Tensor, row: int) -> None:
        import llguidance.torch

        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, row)

    def accept(self, matcher, token_id: int) -> bool:
        return matcher.consume_token(token_id)


LIBRARIES = {"xgrammar": XGrammar, "llguidance": LLGuidance}


def allowed(bitmask: torch.Tensor, row: int, token_id: int) -> bool:
    return bool((int(bitmask[row, token_id // 32]) >> (token_id % 32)) & 1)


def measure(library, reply_ids: list[int], vocab_size: int, rounds: int) -> dict:
    schema = json.dumps(CHARACTER_STATE_SCHEMA)
    compile_s = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        compiled = library.compile(schema)
        compile_s.append(time.perf_counter() - t0)
    words = (vocab_size + 31) // 32
    bitmask = torch.zeros((BATCH_ROWS, words), dtype=torch.int32)
    best_b1 = float("inf")
    matcher_s = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        matcher = library.matcher(compiled)
        matcher_s.append(time.perf_counter() - t0)
        fill_s = 0.0
        for token_id in reply_ids:
            t0 = time.perf_counter()
            library.fill(matcher, bitmask, 0)
            fill_s += time.perf_counter() - t0
            if not allowed(bitmask, 0, token_id) or not library.accept(matcher, token_id):
                raise RuntimeError(f"{library.name} refuses token {token_id} of a valid reply")
        best_b1 = min(best_b1, fill_s / len(reply_ids))
    # 32 rows at staggered positions: row r starts r tokens into the reply, and the steps run until the
    # first row reaches the reply's end.
    matchers = [library.matcher(compiled) for _ in range(BATCH_ROWS)]
    for r, m in enumerate(matchers):
        for token_id in reply_ids[: r % len(reply_ids)]:
            library.accept(m, token_id)
    num_steps = len(reply_ids) - (BATCH_ROWS - 1) % len(reply_ids)
    step_s = []
    for step in range(num_steps):
        t0 = time.perf_counter()
        for r, m in enumerate(matchers):
            library.fill(m, bitmask, r)
        step_s.append(time.perf_counter() - t0)
        for r, m in enumerate(matchers):
            library.accept(m, reply_ids[(r % len(reply_ids)) + step])
    step_s.sort()
    return {
        "compile_ms": round(min(compile_s) * 1e3, 2),
        "compile_ms_median": round(sorted(compile_s)[len(compile_s) // 2] * 1e3, 2),
        "matcher_ms": round(min(matcher_s) * 1e3, 3),
        "mask_b1_us": round(best_b1 * 1e6, 1),
        "mask_b32_us": round(sum(step_s) / len(step_s) * 1e6, 1),
        "mask_b32_us_p90": round(step_s[int(0.9 * (len(step_s) - 1))] * 1e6, 1),
        "reply_tokens": len(reply_ids),
    }


def decode_step_ms(core, requests, num_steps: int) -> float:
    """Run the requests' prefill, then num_steps decode steps of all of them: the mean decode step in ms."""
    for r in requests:
        core.add(r)
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in requests):
        core.step()
    t0 = time.perf_counter()
    for _ in range(num_steps):
        core.step()
    elapsed = time.perf_counter() - t0
    for r in requests:
        core.abort(r.request_id)
    return elapsed / num_steps * 1e3


def measure_steps(rounds: int, num_steps: int) -> dict:
    from bench.alternate import best_alternated
    from salon.engine.config import SchedulerConfig
    from salon.engine.core.engine_core import EngineCore
    from salon.engine.grammar.compiler import GrammarCompiler, GrammarLimits
    from salon.engine.grammar.constraint import Constraint, ConstraintKind
    from salon.engine.grammar.matcher import RequestGrammar
    from salon.engine.request import Request, RequestId, SamplingParams
    from salon.engine.worker.model_loading import load_model

    model, tokenizer = load_model("smollm2-135m-instruct", "int8")
    core = EngineCore(model, tokenizer, SchedulerConfig(256, BATCH_ROWS, 256), 16, 64 << 20, prefix_caching=False)
    compiler = GrammarCompiler(tokenizer, model.config.eos_token_ids, GrammarLimits(compile_workers=0))
    compiled = compiler.compile_now(Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(CHARACTER_STATE_SCHEMA), True))
    prompts = [tokenizer.encode(f"Character {i} as JSON:", add_bos=True) for i in range(BATCH_ROWS)]
    counter = iter(range(1 << 30))

    def batch(constrained: bool) -> list:
        out = []
        for prompt in prompts:
            # No stop tokens: every row decodes for the whole measurement.
            r = Request(RequestId(f"r{next(counter)}"), prompt, SamplingParams(num_steps + 8), frozenset(), 2048)
            r.grammar = RequestGrammar(compiled, tokenizer.vocab_size) if constrained else None
            out.append(r)
        return out

    best = best_alternated(
        {
            "step_ms_free": lambda: decode_step_ms(core, batch(False), num_steps),
            "step_ms_constrained": lambda: decode_step_ms(core, batch(True), num_steps),
        },
        rounds,
    )
    compiler.close()
    figures = {k: round(v, 2) for k, v in best.items()}
    figures["step_constrained_over_free_x"] = round(best["step_ms_constrained"] / best["step_ms_free"], 3)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--libraries", default="xgrammar,llguidance")
    parser.add_argument("--models", default="smollm2-135m-instruct,gemma-3-270m")
    parser.add_argument("--steps", action="store_true", help="also the engine's decode step, constrained vs free")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the --steps engine")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rounds = 2 if args.quick else 5
    result: dict = {}
    libraries = [name for name in args.libraries.split(",") if name]
    for model in args.models.split(",") if libraries else []:
        mf = open_model_file(model)
        tokenizer = Tokenizer(mf.vocab)
        reply_ids = tokenizer.encode(REPLY, add_bos=False, parse_special=False)
        for name in libraries:
            key = f"{name}_{model}"
            if importlib.util.find_spec(name) is None:
                result[key] = {"error": f"{name} is not installed"}
                print(f"{key}: not installed")
                continue
            importlib.import_module(name)  # its import is not the tokenizer's cost
            t0 = time.perf_counter()
            library = LIBRARIES[name](tokenizer, mf.config.eos_token_ids)
            figures = {"tokenizer_ms": round((time.perf_counter() - t0) * 1e3, 1), "vocab_size": tokenizer.vocab_size}
            figures |= measure(library, reply_ids, tokenizer.vocab_size, rounds)
            result[key] = figures
            print(f"{key}: {figures}")
    if args.steps:
        torch.set_num_threads(args.threads)
        result["engine_steps"] = measure_steps(rounds=2 if args.quick else 4, num_steps=8 if args.quick else 24)
        print(f"engine_steps: {result['engine_steps']}")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
