"""A scripted salon.chat.v1.ChatService for the loadgen tests: known replies, every request recorded."""

import asyncio

import grpc
import pytest

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc

EOS = (1, 106)
KEY = "scripted-key-1"


class ScriptedChat(chat_pb2_grpc.ChatServiceServicer):
    def __init__(self, fail_request_ids=()):
        self.requests: list[chat_pb2.GenerateRequest] = []
        self.fail_request_ids = set(fail_request_ids)

    def _check_auth(self, context):
        return dict(context.invocation_metadata()).get("authorization") == f"Bearer {KEY}"

    async def GetModelInfo(self, request, context):
        if not self._check_auth(context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad key")
        return chat_pb2.GetModelInfoResponse(
            model=chat_pb2.ModelInfo(
                model_id="scripted", max_context_tokens=100_000, vocab_size=1000, eos_token_ids=EOS
            )
        )

    async def Generate(self, request, context):
        if not self._check_auth(context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad key")
        self.requests.append(request)
        if request.request_id in self.fail_request_ids:
            self.fail_request_ids.discard(request.request_id)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy")
        n = len(self.requests)
        # Reply: ids 500+n, 600+n (one delta), then <end_of_turn> alone; two deltas 20 ms apart.
        await asyncio.sleep(0.01)
        yield chat_pb2.GenerateResponse(delta=chat_pb2.TokenDelta(text="ab", token_ids=[500 + n, 600 + n]))
        await asyncio.sleep(0.02)
        yield chat_pb2.GenerateResponse(delta=chat_pb2.TokenDelta(text="", token_ids=[106]))
        prompt = 10 * len(request.dialogue.messages)
        yield chat_pb2.GenerateResponse(
            final=chat_pb2.GenerateFinal(
                finish_reason=chat_pb2.FINISH_REASON_STOP_TOKEN,
                usage=chat_pb2.Usage(
                    prompt_tokens=prompt,
                    cached_tokens=chat_pb2.CachedTokens(device=prompt - 10, host=0),
                    generated_tokens=3,
                ),
                engine_id=f"e{len(request.conversation_id) % 2}",
                request_id=request.request_id,
            )
        )


@pytest.fixture
async def scripted():
    servers = []

    async def start(servicer):
        server = grpc.aio.server()
        chat_pb2_grpc.add_ChatServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        await server.stop(None)
