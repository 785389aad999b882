"""Chat defaults that read well: 20 chat openings answered under each sampling setting, in the same run.

    python -m bench.chat_openings [--quick] [--model smollm2-135m-instruct] [--threads 2] [--rounds N]

Each opening is the first user message of a dialogue with `salon chat`'s default character (Ada), rendered
with the model's chat template, answered by an engine core in this process (no gateway), at most
MAX_NEW_TOKENS tokens. Settings:
  old      `salon chat`'s former defaults: greedy with repetition_penalty 1.2 (vLLM's semantics: every
           prompt token is penalised too)
  greedy   greedy, no penalty
  model    the model's default sampling (what a request that sets no sampling gets:
           salon/engine/model/sampling_defaults.py), seeded per opening and round
Rounds alternate the order of the settings; sampled settings draw a new seed each round. Per setting:
  ended_share     replies that end their turn (the model's end-of-turn token) within MAX_NEW_TOKENS
  english_share   replies that stay in English, the openings' language: at least 95% of their letters
                  are ASCII and at least 25% of their words are common English function words (the, and,
                  you, to, ...). English prose runs at 40-55%; Spanish or Portuguese word salad under 10%.
  good_share      replies that do both
over every reply of every round. Last line: RESULT {json}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import time
from collections.abc import Callable

import torch

from salon.cli.chat import DEFAULT_CHARACTER
from salon.engine.api.prompt import Character, ChatMessage, PromptRenderer, Role
from salon.engine.config import SchedulerConfig
from salon.engine.core.engine_core import EngineCore
from salon.engine.model.sampling_defaults import SamplingDefaults
from salon.engine.request import FinishReason, Request, RequestId, SamplingParams
from salon.engine.worker.model_loading import load_serving_model

MAX_NEW_TOKENS = 256
OPENINGS = (
    "Hi Ada! I just moved to Lisbon. Can you recommend three things to do on my first weekend?",
    "Hello! What is your favourite book? Just the title, please.",
    "Hey Ada, how does a refrigerator keep things cold?",
    "Good morning! Could you explain what a compiler does, in simple words?",
    "Hi! I want to start running. How should I begin?",
    "Ada, why is the sky blue?",
    "Hello there. Can you help me plan a birthday dinner for four friends?",
    "Hi Ada, what is a good way to learn a new language as an adult?",
    "Hey! How do bicycles stay upright when they move?",
    "Hello Ada. What should I pack for a weekend hike in the mountains?",
    "Hi! Can you tell me a short story about a lighthouse keeper?",
    "Ada, how do I make a simple tomato soup?",
    "Hello! What is the difference between weather and climate?",
    "Hi Ada, I am nervous about a job interview tomorrow. Any advice?",
    "Hey, how does a battery store energy?",
    "Good evening! Which three houseplants are easy to keep alive?",
    "Hi! Why do cats purr?",
    "Hello Ada, how can I save money on groceries?",
    "Hey Ada! What makes a good cup of coffee?",
    "Hi there. Can you explain how a bill becomes a law, briefly?",
)
STOPWORDS = frozenset(
    "the a an and or but of to in on at for with from by as is are was were be been it its this that these those "
    "i you he she we they me my your our their his her them us do does did have has had not no so if then than "
    "what how why when where which who can will would should could just also very some any all more about into "
    "up out there here".split()
)
_WORD = re.compile(r"[^\W\d_]+")


def stays_english(text: str) -> bool:
    """The reply's language check (see the module docstring)."""
    letters = [c for c in text if c.isalpha()]
    words = [w.lower() for w in _WORD.findall(text)]
    if not letters or not words:
        return False
    ascii_share = sum(c.isascii() for c in letters) / len(letters)
    stopword_share = sum(w in STOPWORDS for w in words) / len(words)
    return ascii_share >= 0.95 and stopword_share >= 0.25


# Other settings --settings can name (candidates for a model's defaults): name -> SamplingDefaults fields.
CANDIDATES = {
    "t0.2_p0.9_rp1.1": {"temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.1},
    "t0.2_p0.9_rp1.05": {"temperature": 0.2, "top_p": 0.9, "repetition_penalty": 1.05},
    "t0.7_p0.9": {"temperature": 0.7, "top_p": 0.9},
    "t0.7_p0.9_rp1.1": {"temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.1},
    "t0.5_minp0.1": {"temperature": 0.5, "min_p": 0.1},
    "greedy_rp1.1": {"temperature": 0.0, "repetition_penalty": 1.1},
}


def sampled(defaults: SamplingDefaults) -> Callable[[int, int], SamplingParams]:
    return lambda i, r: SamplingParams(
        MAX_NEW_TOKENS,
        temperature=defaults.temperature,
        top_k=defaults.top_k,
        top_p=defaults.top_p,
        min_p=defaults.min_p,
        repetition_penalty=defaults.repetition_penalty,
        seed=1000 * r + i,
    )


def settings(defaults: SamplingDefaults, names: list[str]) -> dict[str, Callable[[int, int], SamplingParams]]:
    """Setting name -> (opening index, round) -> SamplingParams."""
    known = {
        "old": lambda i, r: SamplingParams(MAX_NEW_TOKENS, temperature=0.0, repetition_penalty=1.2),
        "greedy": lambda i, r: SamplingParams(MAX_NEW_TOKENS, temperature=0.0),
        "model": sampled(defaults),
    }
    known |= {name: sampled(SamplingDefaults(**fields)) for name, fields in CANDIDATES.items()}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown settings {unknown} (known: {', '.join(known)})")
    return {name: known[name] for name in names}


def answer(core: EngineCore, prompts, params, stop_ids: frozenset[int], tag: str) -> list[tuple[list[int], bool]]:
    """(reply token ids, whether it ended its turn) per prompt, all in one batch."""
    ids: dict[str, list[int]] = {}
    ended: dict[str, bool] = {}
    for i, prompt in enumerate(prompts):
        rid = f"{tag}-{i}"
        core.add(Request(RequestId(rid), list(prompt), params(i), stop_ids, 1 << 30))
        ids[rid] = []
    while len(ended) < len(prompts):
        for e in core.step():
            ids[e.request_id] += e.token_ids
            if e.finish_reason is not None:
                ended[e.request_id] = e.finish_reason == FinishReason.STOP_TOKEN
    return [(ids[f"{tag}-{i}"], ended[f"{tag}-{i}"]) for i in range(len(prompts))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="2 rounds (default 4)")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument(
        "--settings", default="old,greedy,model", help=f"comma-separated: old, greedy, model, {', '.join(CANDIDATES)}"
    )
    args = ap.parse_args()
    rounds = args.rounds or (2 if args.quick else 4)
    torch.set_num_threads(args.threads)
    loaded = load_serving_model(args.model)
    tok, chat = loaded.tokenizer, loaded.chat
    core = EngineCore(loaded.model, tok, SchedulerConfig(512, 64, 1024), 16, 256 << 20, prefix_caching=False)
    renderer = PromptRenderer(chat)
    character = Character("Ada", DEFAULT_CHARACTER)
    prompts = [renderer.render(character, [ChatMessage(Role.USER, text)]) for text in OPENINGS]
    stop_ids = frozenset(chat.stop_token_ids)
    by_setting = settings(loaded.sampling, args.settings.split(","))
    tally = {name: {"replies": 0, "ended": 0, "english": 0, "good": 0, "tokens": 0} for name in by_setting}
    examples: dict[str, str] = {}
    started = time.monotonic()
    for r in range(rounds):
        names = list(by_setting) if r % 2 == 0 else list(reversed(by_setting))
        for name in names:
            replies = answer(core, prompts, lambda i: by_setting[name](i, r), stop_ids, f"{name}{r}")
            for k, (ids, ended) in enumerate(replies):
                text = tok.decode([t for t in ids if t not in stop_ids])
                english = stays_english(text)
                t = tally[name]
                t["replies"] += 1
                t["ended"] += ended
                t["english"] += english
                t["good"] += ended and english
                t["tokens"] += len(ids)
                if k == 0 and r == 0:
                    examples[name] = text
            t = tally[name]
            print(
                f"round {r} {name}: good {t['good']} of {t['replies']} so far ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    result: dict = {
        "model": args.model,
        "openings": len(OPENINGS),
        "rounds": rounds,
        "max_new_tokens": MAX_NEW_TOKENS,
        "model_defaults": dataclasses.asdict(loaded.sampling),
        "threads": args.threads,
    }
    print(f"model={args.model} openings={len(OPENINGS)} rounds={rounds} model defaults: {loaded.sampling}")
    print(f"{'setting':>8} {'ended':>6} {'english':>8} {'good':>6} {'mean tokens':>12}")
    for name, t in tally.items():
        n = t["replies"]
        print(
            f"{name:>8} {t['ended'] / n:>6.2f} {t['english'] / n:>8.2f} {t['good'] / n:>6.2f} {t['tokens'] / n:>12.1f}"
        )
        result[f"{name}_ended_share"] = round(t["ended"] / n, 3)
        result[f"{name}_english_share"] = round(t["english"] / n, 3)
        result[f"{name}_good_share"] = round(t["good"] / n, 3)
        result[f"{name}_mean_reply_tokens"] = round(t["tokens"] / n, 1)
    for name, text in examples.items():
        print(f"--- {name}, opening 1: {text[:300]!r}")
    result["seconds"] = round(time.monotonic() - started, 1)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
