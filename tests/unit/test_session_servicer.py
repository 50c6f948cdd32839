"""SessionService is assembled from per-concern handlers: every RPC of the service is routed
by it (none left to the generated UNIMPLEMENTED stub), wrapped by the one error mapping, and a
streaming one is an async generator function (gRPC's asyncio server runs anything else as a
synchronous generator)."""

from __future__ import annotations

import inspect

import pytest
from google.protobuf.descriptor import MethodDescriptor
from sandboxd.api.session_service import SessionService
from sandboxd.v1 import session_pb2, session_pb2_grpc

_RPCS = list(session_pb2.DESCRIPTOR.services_by_name["SessionService"].methods)


@pytest.mark.parametrize("rpc", _RPCS, ids=lambda m: m.name)
def test_every_rpc_is_routed_and_mapped(rpc: MethodDescriptor) -> None:
    name = rpc.name
    method = SessionService.__dict__.get(name)
    assert method is not None, f"{name} is left to the generated stub"
    assert method is not getattr(session_pb2_grpc.SessionServiceServicer, name)
    assert hasattr(method, "__wrapped__"), f"{name} is not wrapped by api.errors.unary/stream"
    if rpc.server_streaming:
        assert inspect.isasyncgenfunction(method), name
    else:
        assert inspect.iscoroutinefunction(method), name
