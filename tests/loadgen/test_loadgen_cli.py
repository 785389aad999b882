"""`salon bench` as a command against a scripted gateway: figures, RESULT line, JSON report and PNG."""

import asyncio
import json
import sys

from loadgen_scripted import KEY, ScriptedChat, scripted  # noqa: F401 (fixture)

from salon_cli.bench import main as bench_main


async def _run_cli(*args):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "salon_cli.main", "bench", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    return proc.returncode, out.decode(), err.decode()


async def test_bench_cli_against_a_running_gateway(scripted, tmp_path):
    servicer = ScriptedChat()
    target = await scripted(servicer)
    report, plot = tmp_path / "r.json", tmp_path / "r.png"
    rc, out, err = await _run_cli("--target", target, "--api-key", KEY, "--dialogues", "3", "--turns", "2",
                                  "--history-messages", "8", "--time-scale", "0", "--json", str(report),
                                  "--plot", str(plot), "--seed", "5")
    assert rc == 0, err
    last = out.strip().splitlines()[-1]
    assert last.startswith("RESULT ")
    result = json.loads(last[len("RESULT "):])
    assert result["num_turns"] == 6 and result["num_errors"] == 0 and result["mode"] == "cache"
    for key in ("token_hit_rate", "ttft_ms_p50", "ttft_ms_p90", "turns_per_s"):
        assert isinstance(result[key], float)
    measured = [r for r in servicer.requests if not r.request_id.endswith("-prime")]
    assert len(measured) == 6 and len(servicer.requests) == 9  # 3 dialogues primed first
    # The scripted server reports prompt = 10 x messages, cached = prompt - 10.
    prompts = [10 * len(r.dialogue.messages) for r in measured]
    assert result["token_hit_rate"] == (sum(prompts) - 10 * len(prompts)) / sum(prompts)
    data = json.loads(report.read_text())
    assert data["runs"]["cache"]["primed"] and data["runs"]["cache"]["prime_errors"] == []
    assert data["result"] == result and data["workload"]["seed"] == 5 and len(data["records"]["cache"]) == 6
    assert sum(data["runs"]["cache"]["engine_turns"].values()) == 6
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bench [cache]" in err  # the progress bar


def test_bench_cli_rejects_compare_without_launch(capsys):
    assert bench_main(["--compare-no-cache"]) == 2
    assert "--compare-no-cache needs --launch" in capsys.readouterr().err
    assert bench_main(["--launch", "--no-cache", "--compare-no-cache"]) == 2
    assert bench_main(["--regenerate-fraction", "0.9", "--edit-fraction", "0.5"]) == 2


async def test_bench_cli_reports_a_wrong_key(scripted):
    target = await scripted(ScriptedChat())
    rc, out, err = await _run_cli("--target", target, "--api-key", "not-the-key", "--dialogues", "1", "--turns", "1",
                                  "--history-messages", "2")
    assert rc == 1
    assert "salon bench: the gateway refused or is unreachable: UNAUTHENTICATED: bad key" in err
