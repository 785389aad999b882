"""A minimal service on the shared bootstrap, used only by tests/common/test_common_bootstrap.py.

It registers the KVStore API but answers every RPC with a typed error (or an unexpected exception), so
the test can check how the bootstrap maps errors, serves health and reflection, and shuts down.
"""

import asyncio

from salon.kvstore.v1 import kvstore_pb2, kvstore_pb2_grpc
from services.common.errors import InvalidArgument, ResourceExhausted
from services.common.server import ServerConfig, run


class ProbeServicer(kvstore_pb2_grpc.KVStoreServiceServicer):
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

    async def start(self, server, health):
        kvstore_pb2_grpc.add_KVStoreServiceServicer_to_server(ProbeServicer(), server)

        async def become_ready():
            await asyncio.sleep(0.3)
            await health.set_serving()

        self._ready = asyncio.get_running_loop().create_task(become_ready())
        return [kvstore_pb2.DESCRIPTOR.services_by_name["KVStoreService"].full_name]

    async def stop(self):
        print("PROBE STOPPED", flush=True)


if __name__ == "__main__":
    from services.common.config import parse_config

    run(ProbeService(), parse_config(ServerConfig, env_prefix="SALON_PROBE_"))
