"""bench.engine end to end (--quick): salon's figures and RESULT line; without a peer its ratios are null, and with
one (a scripted llama-batched-bench: its figures known exactly) salon's sweep and the peer's alternate in rounds,
each level's salon / peer ratio taken within a round."""

import json
import stat
import subprocess
import sys
from pathlib import Path

# A stand-in for llama-batched-bench: its n-th call reports t_pp = t_tg = 0.1 n s for every -npl level (so its
# aggregate, pl * tg / (t_pp + t_tg), halves from the first call to the second), and counts its calls.
FAKE_BATCHED_BENCH = """#!{python}
import json, sys
from pathlib import Path
argv = sys.argv[1:]
if argv == ["--version"]:
    print("version: 0.6.0-dev (build 4321, commit 0abc123)", file=sys.stderr)
    sys.exit(0)
calls = Path(__file__).with_name("calls")
n = int(calls.read_text()) + 1 if calls.exists() else 1
calls.write_text(str(n))
pp, tg = int(argv[argv.index("-npp") + 1]), int(argv[argv.index("-ntg") + 1])
for pl in argv[argv.index("-npl") + 1].split(","):
    t = 0.1 * n
    print(json.dumps({{"n_kv_max": 4096, "pp": pp, "tg": tg, "pl": int(pl), "t_pp": t, "t_tg": t, "t": 2 * t}}))
"""


def _bench(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.engine", "--quick", "--threads", "1", "--kv-cache-bytes", str(64 << 20), *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT ")
    return json.loads(last[len("RESULT ") :]), proc.stdout


def test_bench_engine_quick_without_a_peer():
    result, out = _bench("--model", "synthetic-tiny")
    for n in (1, 4, 32, 64):
        assert result[f"tokens_per_s_continuous_{n}"] > 0 and result[f"tokens_per_s_sequential_{n}"] > 0
    assert result["tokens_per_s_static_32"] > 0 and result["tokens_per_s_static_64"] is None
    assert result["peer"] is None and result["peer_error"] == "llama.cpp runs the Gemma GGUF only, not synthetic-tiny"
    assert "peer: none measured" in out


def test_bench_engine_alternates_with_the_peer(tmp_path):
    tool = Path(tmp_path) / "llama-batched-bench"
    tool.write_text(FAKE_BATCHED_BENCH.format(python=sys.executable))
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    result, out = _bench(
        "--model", "gemma-3-270m", "--prompt-tokens", "8", "--new-tokens", "2", "--rounds", "2",
        "--llama-cpp", str(tmp_path),
    )  # fmt: skip
    assert (tmp_path / "calls").read_text() == "2"  # the peer ran once a round
    p = result["peer"]
    assert "peer_error" not in result and p["rounds"] == 2 and p["llama_cpp"]["version"] == "b4321"
    for n in (1, 4, 32, 64):
        first, second = n * 2 / 0.2, n * 2 / 0.4  # the fake's aggregate in its two calls
        assert p[f"tokens_per_s_{n}"] == round((first + second) / 2, 2)
        for mode in ("static", "continuous"):
            r = p[f"salon_over_peer_{mode}_{n}_x"]
            if mode == "static" and n == 64:  # salon runs no static batch of 64
                assert r is None
                continue
            assert r["rounds"] == 2 and r["peer_median"] == (first + second) / 2, (mode, n)
            assert r["salon_median"] > 0 and r["min"] <= r["median"] <= r["max"]
            assert r["min"] == min(r["ratios"]) and r["max"] == max(r["ratios"])
    assert "2 alternated rounds" in out
