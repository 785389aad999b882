"""The gRPC message limits every server and client channel between services shares."""

from __future__ import annotations

# Largest gRPC message accepted or sent between services; bigger ones fail with RESOURCE_EXHAUSTED in
# grpc itself. The public port takes less (the gateway's --max-receive-message-bytes).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def grpc_options(max_receive_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_receive_message_bytes),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
