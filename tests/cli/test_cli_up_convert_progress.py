"""`salon up` shows an engine's first conversion of a GGUF on its console: a line per 10% of the tensors."""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess

from test_cli_up_chat import SALON, up_args

from salon.engine.model.checkpoint import checkpoint_path
from salon.engine.model.sources import resolve_source
from tests.model.gguf_files import write_llama_gguf


def test_the_first_conversion_prints_its_progress_under_salon_up(tmp_path):
    # A file no cache has seen (a fresh seed), so the engine converts it at its first start.
    path = tmp_path / "fresh-llama.gguf"
    write_llama_gguf(path, seed=secrets.randbelow(1 << 30), num_layers=4)
    cached = checkpoint_path(resolve_source(str(path)).sha256).parent
    _gw, args = up_args(tmp_path / "state")
    args[args.index("synthetic-tiny")] = str(path)
    try:
        result = subprocess.run([*SALON, *args, "--exit-when-serving"], capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr
        lines = [line for line in result.stdout.splitlines() if line.startswith("engine-0: convert fresh-llama")]
        body = [line.removeprefix("engine-0: convert fresh-llama to int8: ") for line in lines]
        percents = [int(m.group(1)) for b in body if (m := re.match(r"(\d+)% of tensors \(", b))]
        assert percents[:5] == [10, 20, 30, 40, 50] and percents[-1] == 80, body
        assert re.fullmatch(r"done in \d+ s", body[-1]), body
        # Before the banner: the banner comes once the engine serves.
        out = result.stdout
        assert out.index("engine-0: convert fresh-llama") < out.index("salon is up:"), out
    finally:
        shutil.rmtree(cached, ignore_errors=True)
