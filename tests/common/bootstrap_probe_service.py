"""A minimal service on the shared bootstrap, used only by tests/common/test_common_bootstrap.py.

It registers the KVStore API but answers every RPC with a typed error (or an unexpected exception), so
the test can check how the bootstrap maps errors, serves health and reflection, and shuts down.
ReleaseLease makes the service give up (health.fatal: the process exits with EXIT_FATAL). With
`--internal` first on the command line it is an internal service that only engine identities may call.
"""

import asyncio
import sys

from salon.api.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from salon.common.errors import InvalidArgument, ResourceExhausted
from salon.common.peer_identity import AccessPolicy
from salon.common.server import ServerConfig, run


class ProbeServicer(kvstore_pb2_grpc.KVStoreServiceServicer):
    def __init__(self, health) -> None:
        self.health = health

    async def ReleaseLease(self, request, context):
        self.health.fatal("probe: asked to give up")
        return kvstore_pb2.ReleaseLeaseResponse(released=True)

    async def Match(self, request, context):
        raise InvalidArgument("namespace: must be 32 bytes, got 0")

    async def GetStats(self, request, context):
        raise ResourceExhausted("probe: over capacity", retry_after_ms=250)

    async def Drop(self, request, context):
        raise RuntimeError("secret internal detail")

    async def Fetch(self, request, context):
        yield kvstore_pb2.FetchResponse(header=kvstore_pb2.FetchHeader(num_tokens=16))
        raise InvalidArgument("num_tokens: beyond the usable prefix")


class ProbeService:
    name = "probe"

    def __init__(self, internal: bool = False) -> None:
        self.access_policy = (
            AccessPolicy({"/salon.kvstore.v1.KVStoreService/": frozenset({"engine"})}) if internal else None
        )

    async def start(self, server, health):
        kvstore_pb2_grpc.add_KVStoreServiceServicer_to_server(ProbeServicer(health), server)

        async def become_ready():
            await asyncio.sleep(0.3)
            await health.set_serving()

        self._ready = asyncio.get_running_loop().create_task(become_ready())
        return [kvstore_pb2.DESCRIPTOR.services_by_name["KVStoreService"].full_name]

    async def stop(self):
        print("PROBE STOPPED", flush=True)


if __name__ == "__main__":
    from salon.common.config import parse_config

    internal = sys.argv[1:2] == ["--internal"]
    run(
        ProbeService(internal),
        parse_config(ServerConfig, sys.argv[2:] if internal else None, env_prefix="SALON_PROBE_"),
    )
