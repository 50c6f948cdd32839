"""What tools ask a server about itself: health (Check, Watch, List) and reflection (v1, v1alpha).

grpcurl and `buf curl` describe services through reflection and stop at the first symbol the
server cannot resolve: grpcio-reflection serves only `grpc.reflection.v1alpha`, and newer tools
ask `grpc.reflection.v1`, whose own file the pool did not hold ("Symbol not found:
grpc.reflection.v1.ServerReflection"). Types no service names (the `ErrorReason` enum of
errors.proto) were never loaded into the pool, so they could not be described either.
grpcio-health-checking's servicer leaves the newer `Health/List` unimplemented, which answered
UNIMPLEMENTED with a Python exception text.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

import sandboxd.v1

REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
_V1ALPHA_PACKAGE = "grpc.reflection.v1alpha"
_V1_PACKAGE = "grpc.reflection.v1"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


class Health(health.aio.HealthServicer):  # type: ignore[misc]  # the library is untyped
    """The library's health servicer with `List`: every service's status, as Check gives it."""

    async def List(  # noqa: N802 (the RPC's name)
        self, request: health_pb2.HealthListRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthListResponse:
        statuses = {
            name: health_pb2.HealthCheckResponse(status=status)
            for name, status in dict(self._server_status).items()
        }
        return health_pb2.HealthListResponse(statuses=statuses)


def load_every_message_file() -> None:
    """Import every generated `*_pb2` module of the API, so reflection can describe every type."""
    for module in pkgutil.iter_modules(sandboxd.v1.__path__):
        if module.name.endswith("_pb2"):
            importlib.import_module(f"sandboxd.v1.{module.name}")


def _register_reflection_v1(pool: descriptor_pool.DescriptorPool) -> None:
    """Put `grpc/reflection/v1/reflection.proto` in the pool: v1alpha's file under v1's names.

    The two versions have the same messages, fields and numbers (v1 is v1alpha promoted), so
    one servicer and one wire format serve both; only the names a tool resolves differ.
    """
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = _V1_FILE
    proto.package = _V1_PACKAGE
    proto.options.Clear()
    old, new = f".{_V1ALPHA_PACKAGE}.", f".{_V1_PACKAGE}."
    for message in proto.message_type:
        for field in message.field:
            if field.type_name.startswith(old):
                field.type_name = new + field.type_name[len(old) :]
    for service in proto.service:
        for method in service.method:
            method.input_type = new + method.input_type[len(old) :]
            method.output_type = new + method.output_type[len(old) :]
    pool.AddSerializedFile(proto.SerializeToString())


def add_reflection(server: grpc.aio.Server, service_names: Sequence[str]) -> None:
    """Reflection under both names, describing every service and type of the API."""
    load_every_message_file()
    _register_reflection_v1(descriptor_pool.Default())
    names = (*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME, REFLECTION_V1)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.method_handlers_generic_handler(
        REFLECTION_V1,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((v1,))
