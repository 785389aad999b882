"""bench.model runs end to end (--quick, synthetic-tiny: no peer for it) and ends with its RESULT line: the
bench drives the engine's own step path (ModelRunner), so a change of that path's interface breaks it here,
not first in someone's measurement."""

import json
import subprocess
import sys

from tests.model.conftest import gemma_served_activations, reference_path


def test_bench_model_quick_runs_the_engine_step_path_and_reports():
    reference_dir = reference_path("gpl-3.txt").parent  # the perplexity text
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.model",
            "--quick",
            "--threads",
            "1",
            "--model",
            "synthetic-tiny",
            "--reference-dir",
            str(reference_dir),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT ")
    result = json.loads(last[len("RESULT ") :])
    for batch in (1, 4, 8, 32):
        assert result[f"decode_tokens_per_s_b{batch}"] > 0
    assert result["prefill_tokens_per_s_512"] > 0 and result["ppl_int8"] > 0
    assert result["kv_bytes_per_token"] == 160  # synthetic-tiny's int8 KV (bench.model's KV table)
    assert result["peer"] is None  # llama.cpp serves the Gemma GGUF only: measured, never assumed
    assert result["peer_error"]
    # Side-by-side figures of salon's own: alternated rounds, a ratio per round, the median and range of them.
    for key, rounds in (
        ("decode_step_b4_over_b1_x", 3),
        ("decode_step_b8_over_b1_x", 3),
        ("huge_pages_decode_b1_speedup_x", 2),
    ):
        r = result[key]
        assert r["rounds"] == rounds and len(r["ratios"]) == rounds, key
        assert r["min"] == min(r["ratios"]) and r["max"] == max(r["ratios"]), key
        assert r["min"] <= r["median"] <= r["max"] and r["min"] > 0, key
    shipped = result["activations_shipped"]
    other = (
        next(k for k in result if k.startswith("activations_decode_b1_shipped_over_"))
        .removesuffix("_x")
        .rsplit("_over_", 1)[1]
    )
    r = result[f"activations_decode_b1_shipped_over_{other}_x"]
    assert r["rounds"] == 2 and round(r["shipped_median"], 3) == result["activations_decode_b1_ms_per_token_shipped"]
    # synthetic-tiny is a Gemma 3 model: timed in the recipe the engine serves it with, against two int8 terms
    assert (shipped, other) == (gemma_served_activations(), "two_terms")


# Stand-ins for llama-bench and llama-batched-bench (one script, by its name): the n-th call of either reports
# rates that change from call to call, so each round's peer figures are known exactly; calls are counted per tool.
FAKE_LLAMA_TOOL = """#!{python}
import json, sys
from pathlib import Path
argv, name = sys.argv[1:], Path(__file__).name
if argv == ["--version"]:
    print("version: 0.6.0-dev (build 4321, commit 0abc123)", file=sys.stderr)
    sys.exit(0)
calls = Path(__file__).with_name(name + ".calls")
n = int(calls.read_text()) + 1 if calls.exists() else 1
calls.write_text(str(n))
def arg(flag):
    return argv[argv.index(flag) + 1]
if name == "llama-bench":
    t = int(arg("-t"))
    print(json.dumps([
        {{"n_prompt": int(arg("-p")), "n_gen": 0, "n_threads": t, "n_depth": 0, "avg_ts": 1000.0 * 10 ** (n - 1)}},
        {{"n_prompt": 0, "n_gen": int(arg("-n")), "n_threads": t, "n_depth": 0, "avg_ts": 100.0 / n}},
    ]))
else:
    pp, tg = int(arg("-npp")), int(arg("-ntg"))
    for pl in arg("-npl").split(","):
        print(json.dumps({{"pp": pp, "tg": tg, "pl": int(pl), "t_pp": 0.1, "t_tg": 0.1 * n, "t": 0.1 + 0.1 * n}}))
"""


def test_bench_model_alternates_rounds_with_the_peer(tmp_path):
    """bench.model's peer comparison with scripted tools: 3 rounds, the peer run once a round, salon's figures of
    the same round against its figures; the peer's medians exact."""
    import argparse

    import torch

    from bench.model import PEER_FIGURES, _peer
    from salon.engine.worker.model_loading import load_model

    for name in ("llama-bench", "llama-batched-bench"):
        tool = tmp_path / name
        tool.write_text(FAKE_LLAMA_TOOL.format(python=sys.executable))
        tool.chmod(0o755)
    torch.set_num_threads(1)
    model, _ = load_model("synthetic-tiny", "int8", "cpu")
    args = argparse.Namespace(llama_cpp=str(tmp_path), model="gemma-3-270m", threads=1)
    out, error = _peer(args, model, steps=4, rounds=3)
    assert error is None
    assert (tmp_path / "llama-bench.calls").read_text() == (tmp_path / "llama-batched-bench.calls").read_text() == "3"
    assert out["rounds"] == 3 and out["threads"] == 1 and out["llama_cpp"]["version"] == "b4321"
    # Rounds n = 1..3: pp512 1000 x 10^(n-1), batch 1 100 / n, batch B B * 4 / (0.1 n): the medians are round 2's.
    assert out["prefill_tokens_per_s_512"] == 10000.0 and out["decode_tokens_per_s_b1"] == 50.0
    assert [out[f"decode_tokens_per_s_b{b}"] for b in (4, 8, 32)] == [80.0, 160.0, 640.0]
    for key in PEER_FIGURES:
        r = out[f"salon_over_peer_{key}_x"]
        assert r["rounds"] == 3 and len(r["ratios"]) == 3, key
        assert r["min"] == min(r["ratios"]) and r["max"] == max(r["ratios"]) and r["min"] <= r["median"] <= r["max"]
        assert r["peer_median"] == out[key]
    # A ratio per round: the peer's prefill grows tenfold a round, far beyond salon's spread, so the rounds' ratios
    # fall round by round (a ratio of bests, or of medians, would give one number).
    prefill = out["salon_over_peer_prefill_tokens_per_s_512_x"]
    assert prefill["ratios"][0] > prefill["ratios"][1] > prefill["ratios"][2]
    assert prefill["max"] / prefill["min"] > 10
