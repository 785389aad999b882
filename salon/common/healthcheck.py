"""`python -m salon.common.healthcheck HOST:PORT`: exit 0 if the service reports SERVING (container probes)."""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m salon.common.healthcheck HOST:PORT", file=sys.stderr)
        return 2
    try:
        with grpc.insecure_channel(args[0]) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3).status
    except grpc.RpcError as exc:
        print(f"{args[0]}: {exc.code().name}", file=sys.stderr)
        return 1
    serving = status == health_pb2.HealthCheckResponse.SERVING
    print(f"{args[0]}: {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
