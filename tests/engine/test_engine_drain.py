"""SIGTERM drains an engine: load reports say draining, in-flight streams finish, the process exits 0."""

import signal
import threading

import grpc

from salon.api.chat.v1 import chat_pb2
from salon.api.engine.v1 import engine_pb2, engine_pb2_grpc
from salon.common.internal_auth import INSECURE_LOOPBACK_FLAGS
from salon.common.process import start_service


def test_sigterm_drains_streams_and_reports_draining(tmp_path):
    engine = start_service(
        "engine",
        [*INSECURE_LOOPBACK_FLAGS, "--port", "0", "--model", "synthetic-tiny", "--grace-s", "30"],
        log_path=tmp_path / "engine.log",
    )
    try:
        with grpc.insecure_channel(engine.address) as ch:
            stub = engine_pb2_grpc.EngineServiceStub(ch)
            reports = stub.WatchLoad(engine_pb2.WatchLoadRequest(interval_ms=20))
            assert next(reports).load.draining is False
            request = engine_pb2.GenerateRequest(
                request_id="long",
                tokens=chat_pb2.TokenizedPrompt(token_ids=[2] + list(range(1000, 1100))),
                sampling=chat_pb2.SamplingParams(max_new_tokens=2000),  # still running at the SIGTERM
            )
            stream = stub.Generate(request, timeout=120)
            first = next(stream)
            assert first.HasField("delta")
            events = []
            reader = threading.Thread(target=lambda: events.extend(stream))
            reader.start()
            engine.signal(signal.SIGTERM)
            assert any(r.load.draining for r in reports)
            reader.join(120)
        final = events[-1].final
        generated = len(first.delta.token_ids) + sum(len(e.delta.token_ids) for e in events if e.HasField("delta"))
        assert final.finish_reason in (chat_pb2.FINISH_REASON_LENGTH, chat_pb2.FINISH_REASON_STOP_TOKEN)
        assert final.usage.generated_tokens == generated
        assert engine.process.wait(60) == 0
    finally:
        engine.kill()
