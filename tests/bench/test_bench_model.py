"""bench.model runs end to end (--quick, synthetic-tiny: no peer for it) and ends with its RESULT line: the
bench drives the engine's own step path (ModelRunner), so a change of that path's interface breaks it here,
not first in someone's measurement."""

import json
import subprocess
import sys

from tests.model.conftest import reference_path


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
