"""gRPC server reflection as both `grpc.reflection.v1` (what grpcurl and current clients ask first) and
`grpc.reflection.v1alpha` (what older ones ask).

grpcio-reflection implements v1alpha only. The v1 protocol is the same messages under another package,
so one servicer answers both: v1's service is the v1alpha handler registered under v1's name (the bytes
on the wire are identical), and v1's file descriptor, v1alpha's renamed, is added to the descriptor pool
so that reflection can describe itself under both names.
"""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1ALPHA_SERVICE_NAME = reflection.SERVICE_NAME
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE_NAME = f"{V1_PACKAGE}.ServerReflection"
V1_METHOD = f"/{V1_SERVICE_NAME}/ServerReflectionInfo"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def add_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    """v1alpha's reflection.proto with the v1 package name, added to `pool` once."""
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    old = f".{proto.package}."
    proto.name, proto.package = _V1_FILE, V1_PACKAGE
    for message in proto.message_type:
        for f in message.field:
            if f.type_name:
                f.type_name = f.type_name.replace(old, f".{V1_PACKAGE}.")
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, f".{V1_PACKAGE}.")
            method.output_type = method.output_type.replace(old, f".{V1_PACKAGE}.")
    pool.Add(proto)


def enable_reflection(service_names: list[str], server: grpc.aio.Server) -> None:
    """Serve reflection (v1 and v1alpha) for `service_names` and the reflection services themselves."""
    pool = descriptor_pool.Default()
    add_v1_descriptor(pool)
    servicer = reflection.aio.ReflectionServicer([*service_names, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME], pool=pool)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(V1ALPHA_SERVICE_NAME, {"ServerReflectionInfo": handler}),
            grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {"ServerReflectionInfo": handler}),
        )
    )
