"""The engine process as shipped runs its steps in one OpenMP team: its step thread's threads (the step thread and
its OpenMP workers, the threads with the step's nice value) do not sleep at the kernels' barriers.

libgomp keeps a pool of workers for every thread that has run a parallel region, as long as that thread lives; once
the pools' threads outnumber the cores the process may use, a thread waiting at a barrier sleeps in the kernel after
100 spins instead of about 300,000. The engine loads and warms its model on a thread that ends
(bootstrap.build_engine_on_a_passing_thread); loaded on a thread that lives on, every step paid a futex sleep and
wake-up per barrier (measured in a served trace on 2 cores: 6,500 sleeps a second per thread, steps twice as long).

The engine runs with 2 intra-op threads on 2 of the host's CPUs (its affinity, which libgomp counts), as on the
2-core hosts salon serves from, so the pools would outnumber its cores here on any host."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.process import start_service
from salon.engine.config import EngineConfig

NEW_TOKENS = 96
# Sleeps per generated token of the step thread's threads together: measured 4.7-5.0 (447-476 in 96 steps: the
# worker between steps, the step thread handing tokens to the event loop); loaded on a thread that lives on, 249.
MAX_SLEEPS_PER_TOKEN = 6.0


def _step_threads(pid: int) -> dict[int, int]:
    """Voluntary context switches of each thread of `pid` at the step thread's nice value."""
    out = {}
    step_nice = EngineConfig().step_nice
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            nice = int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])
            status = (task / "status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if nice == step_nice:
            line = next(x for x in status.splitlines() if x.startswith("voluntary_ctxt_switches:"))
            out[int(task.name)] = int(line.split()[1])
    return out


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.fail("the engine's OpenMP team needs 2 CPUs to run on")
    os.sched_setaffinity(0, cpus[:2])  # the engine inherits the affinity it starts with
    try:
        proc = start_service(
            "engine",
            [
                *INSECURE_LOOPBACK_FLAGS,
                "--port",
                "0",
                "--model",
                "gemma-3-270m",
                "--engine-id",
                "e-omp",
                "--torch-threads",
                "2",
            ],
            log_path=tmp_path_factory.mktemp("omp") / "engine.log",
            timeout_s=300,
        )
    finally:
        os.sched_setaffinity(0, cpus)
    yield proc
    assert proc.stop() == 0


def _sleeps_per_token(engine, stub, num_threads: int | None = None) -> float:
    """The step thread's threads' voluntary context switches per token of a 96-token reply to a 401-token prompt
    (and that they are `num_threads`)."""
    request = engine_pb2.GenerateRequest(
        tokens=chat_pb2.TokenizedPrompt(token_ids=[2] + [9259, 1902, 563, 496] * 100),
        sampling=chat_pb2.SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True),
    )
    before = _step_threads(engine.process.pid)
    generated = sum(len(r.delta.token_ids) for r in stub.Generate(request, timeout=120))
    after = _step_threads(engine.process.pid)
    assert generated == NEW_TOKENS
    assert num_threads is None or len(after) == num_threads, f"threads at the step's nice value: {after}"
    return sum(after[t] - before.get(t, 0) for t in after) / generated


def test_the_step_threads_do_not_sleep_at_the_kernels_barriers(engine):
    with grpc.insecure_channel(engine.address) as channel:
        stub = engine_pb2_grpc.EngineServiceStub(channel)
        # the step thread and its one OpenMP worker
        assert _sleeps_per_token(engine, stub, num_threads=2) <= MAX_SLEEPS_PER_TOKEN


def test_nor_after_a_constrained_reply(engine):
    """A JSON schema compiles on the grammar compiler's threads and its masks are filled on a thread the step
    thread starts (it then sleeps while the plain reply is measured): none of them starts another OpenMP team."""
    schema = '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'
    with grpc.insecure_channel(engine.address) as channel:
        stub = engine_pb2_grpc.EngineServiceStub(channel)
        constrained = engine_pb2.GenerateRequest(
            tokens=chat_pb2.TokenizedPrompt(token_ids=[2, 9259, 1902, 563]),
            sampling=chat_pb2.SamplingParams(
                max_new_tokens=24, constraint=chat_pb2.Constraint(json_schema=chat_pb2.JsonSchema(schema=schema))
            ),
        )
        final = [r.final for r in stub.Generate(constrained, timeout=120) if r.HasField("final")][0]
        assert final.usage.generated_tokens > 0
        assert _sleeps_per_token(engine, stub) <= MAX_SLEEPS_PER_TOKEN
