"""The newcomer's path: `salon up` with every default (as scripts/up.sh runs it), then the official openai SDKs,
Python and Node, against the HTTP address and key its banner prints, sending no sampling: the model's
defaults apply (temperature 0.2, top-p 0.9, repetition penalty 1.1): replies are sampled, and both SDKs get the same
reply for the same seed, streamed or not. (How well the defaults read is bench/chat_openings.py's measure.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import grpc
import openai
import pytest
from salon_up import salon_up

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.cli.up import DEFAULT_MODEL

NODE_DIR = Path(__file__).resolve().parents[2] / "clients" / "node"
IN_CI = os.environ.get("CI", "").lower() == "true"
OPENING = "Hi Ada! I just moved to Lisbon. Can you recommend three things to do on my first weekend?"
MESSAGES = [{"role": "system", "content": "You are Ada, a warm, witty engineer."}, {"role": "user", "content": OPENING}]
SEED = 7
MAX_TOKENS = 48
NODE_SCRIPT = """
import OpenAI from "openai";
const [baseURL, apiKey, model, seed, maxTokens, messages] = process.argv.slice(1);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const request = { model, seed: Number(seed), max_tokens: Number(maxTokens), messages: JSON.parse(messages) };
const whole = await client.chat.completions.create(request);
let text = "";
let finish = null;
for await (const chunk of await client.chat.completions.create({ ...request, stream: true })) {
  for (const choice of chunk.choices) { text += choice.delta?.content ?? ""; finish = choice.finish_reason ?? finish; }
}
console.log("RESULT " + JSON.stringify({ whole: whole.choices[0].message.content,
  whole_finish: whole.choices[0].finish_reason, tokens: whole.usage.completion_tokens, stream: text,
  stream_finish: finish }));
"""


def test_defaults_then_the_python_and_node_sdks(tmp_path):
    node_ok = shutil.which("node") and (NODE_DIR / "node_modules" / "openai").exists()
    if not node_ok and IN_CI:
        pytest.fail("node or clients/node/node_modules/openai is missing (scripts/setup_dev.sh installs them)")
    with salon_up(tmp_path) as banner:
        (base_url,) = [m.group(1) for line in banner if (m := re.match(r"^  http\s+(\S+) \(OpenAI API\)$", line))]
        (key,) = [m.group(1) for line in banner if (m := re.search(r"'Authorization: Bearer (\S+)'$", line.strip()))]
        (grpc_target,) = [m.group(1) for line in banner if (m := re.match(r"^chat with it:.* --target (\S+) ", line))]
        assert base_url == "http://127.0.0.1:8000/v1"

        # The defaults the engine reports, from the known-models table (the file has no general.sampling.*).
        with grpc.insecure_channel(grpc_target) as channel:
            info = chat_pb2_grpc.ChatServiceStub(channel).GetModelInfo(
                chat_pb2.GetModelInfoRequest(), metadata=(("authorization", f"Bearer {key}"),), timeout=60
            )
        d = info.model.default_sampling
        assert (d.temperature, d.top_p, d.top_k, d.min_p, d.repetition_penalty) == pytest.approx((0.2, 0.9, 0, 0, 1.1))

        client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=300)
        request = dict(model=DEFAULT_MODEL, messages=MESSAGES, seed=SEED, max_tokens=MAX_TOKENS)
        whole = client.chat.completions.create(**request)
        reply, finish = whole.choices[0].message.content, whole.choices[0].finish_reason
        assert reply and 0 < whole.usage.completion_tokens <= MAX_TOKENS
        chunks = list(client.chat.completions.create(**request, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [finish]
        # The omitted fields took the model's defaults: the same as asking for them, not OpenAI's temperature 1.
        explicit = client.chat.completions.create(
            **request, temperature=0.2, top_p=0.9, extra_body={"repetition_penalty": 1.1}
        )
        assert explicit.choices[0].message.content == reply
        neutral = client.chat.completions.create(**request, temperature=1.0, top_p=1.0)
        assert neutral.choices[0].message.content != reply
        # Another seed samples another reply: the defaults do sample (temperature 0.2, not greedy).
        replies = {
            client.chat.completions.create(**{**request, "seed": s}).choices[0].message.content for s in range(1, 5)
        }
        assert len(replies) > 1, replies

        if not node_ok:
            pytest.skip("node or clients/node/node_modules/openai is missing: the Node half did not run")
        node = subprocess.run(
            ["node", "--input-type=module", "-e", NODE_SCRIPT, base_url, key, DEFAULT_MODEL, str(SEED), str(MAX_TOKENS)]
            + [json.dumps(MESSAGES)],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert node.returncode == 0, node.stderr
        result = json.loads(node.stdout.strip().splitlines()[-1].removeprefix("RESULT "))
        assert result == {
            "whole": reply,
            "whole_finish": finish,
            "tokens": whole.usage.completion_tokens,
            "stream": reply,
            "stream_finish": finish,
        }
