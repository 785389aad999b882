"""`salon bench` as a command against a scripted gateway: figures, RESULT line, JSON report and PNG."""

import asyncio
import json
import sys

from loadgen_scripted import KEY, ScriptedChat, scripted  # noqa: F401 (fixture)

from salon.cli.bench import main as bench_main


async def _run_cli(*args):
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "salon.cli.main",
        "bench",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    return proc.returncode, out.decode(), err.decode()


async def test_bench_cli_against_a_running_gateway(scripted, tmp_path):
    """No priming by default: every request the gateway sees is a measured turn, and every figure says so."""
    servicer = ScriptedChat()
    target = await scripted(servicer)
    report, plot = tmp_path / "r.json", tmp_path / "r.png"
    rc, out, err = await _run_cli(
        "--target",
        target,
        "--api-key",
        KEY,
        "--dialogues",
        "3",
        "--turns",
        "2",
        "--history-messages",
        "8",
        "--time-scale",
        "0",
        "--json",
        str(report),
        "--plot",
        str(plot),
        "--seed",
        "5",
    )
    assert rc == 0, err
    last = out.strip().splitlines()[-1]
    assert last.startswith("RESULT ")
    result = json.loads(last[len("RESULT ") :])
    assert result["num_turns"] == 6 and result["num_errors"] == 0 and result["mode"] == "cache"
    assert result["primed"] is False and result["mode_title"] == "salon with its caches, not primed"
    assert result["working_set"] is False and result["preset"] == "default"
    assert result["peer"] is None and result["peer_error"] == "not requested (--compare-llama-server)"
    assert "[salon with its caches, not primed] 6 turns" in out
    assert "not primed" in out.splitlines()[0]  # the trace line
    for key in ("token_hit_rate", "ttft_ms_p50", "ttft_ms_p90", "turns_per_s", "ttft_ms_p90_warm_turns"):
        assert isinstance(result[key], float), key
    assert result["num_warm_turns"] == 3  # unprimed: each dialogue's first turn is not a returning one
    assert len(servicer.requests) == 6 and not any(r.request_id.endswith("-prime") for r in servicer.requests)
    # The scripted server reports prompt = 10 x messages, cached = prompt - 10.
    prompts = [10 * len(r.dialogue.messages) for r in servicer.requests]
    assert result["token_hit_rate"] == (sum(prompts) - 10 * len(prompts)) / sum(prompts)
    data = json.loads(report.read_text())
    assert not data["runs"]["cache"]["primed"] and data["workload"]["prime_history"] is False
    assert data["result"] == result and data["workload"]["seed"] == 5 and len(data["records"]["cache"]) == 6
    assert sum(data["runs"]["cache"]["engine_turns"].values()) == 6
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bench [cache]" in err  # the progress bar


async def test_bench_cli_prime_is_an_option_and_labelled(scripted):
    servicer = ScriptedChat()
    target = await scripted(servicer)
    rc, out, err = await _run_cli(
        "--target",
        target,
        "--api-key",
        KEY,
        "--dialogues",
        "3",
        "--turns",
        "2",
        "--history-messages",
        "8",
        "--time-scale",
        "0",
        "--seed",
        "5",
        "--prime",
    )
    assert rc == 0, err
    result = json.loads(out.strip().splitlines()[-1][len("RESULT ") :])
    assert result["primed"] is True and result["mode_title"] == "salon with its caches, primed"
    assert "[salon with its caches, primed] 6 turns" in out and "histories primed in" in out
    measured = [r for r in servicer.requests if not r.request_id.endswith("-prime")]
    assert len(measured) == 6 and len(servicer.requests) == 9  # 3 dialogues primed first
    assert result["num_warm_turns"] == 6  # primed: every turn is a returning one


def test_bench_cli_rejects_compare_without_launch(capsys):
    assert bench_main(["--compare-no-cache"]) == 2
    assert "--compare-no-cache needs --launch" in capsys.readouterr().err
    assert bench_main(["--compare-llama-server"]) == 2
    assert "--compare-llama-server needs --launch" in capsys.readouterr().err
    assert bench_main(["--working-set"]) == 2
    assert "--working-set needs --launch" in capsys.readouterr().err
    assert bench_main(["--launch", "--compare-llama-server", "--model", "synthetic-tiny"]) == 2
    assert "--compare-llama-server needs --model gemma-3-270m" in capsys.readouterr().err
    assert bench_main(["--launch", "--rounds", "2"]) == 2
    assert "--rounds needs --compare-llama-server and at least 1" in capsys.readouterr().err
    assert bench_main(["--launch", "--compare-llama-server", "--rounds", "0"]) == 2
    assert "--rounds needs --compare-llama-server and at least 1" in capsys.readouterr().err
    assert bench_main(["--launch", "--working-set", "--compare-no-cache"]) == 2
    assert bench_main(["--launch", "--working-set", "--kvstore-fractions", "0.5,1.5"]) == 2
    assert "each must be in (0, 1)" in capsys.readouterr().err
    assert bench_main(["--launch", "--no-cache", "--compare-no-cache"]) == 2
    assert bench_main(["--regenerate-fraction", "0.9", "--edit-fraction", "0.5"]) == 2


async def test_bench_cli_reports_a_wrong_key(scripted):
    target = await scripted(ScriptedChat())
    rc, out, err = await _run_cli(
        "--target", target, "--api-key", "not-the-key", "--dialogues", "1", "--turns", "1", "--history-messages", "2"
    )
    assert rc == 1
    assert "salon bench: the gateway refused or is unreachable: UNAUTHENTICATED: bad key" in err
