"""Which RPCs the web gateway carries, and their two codecs (binary protobuf and JSON).

Read from the services' descriptors, so a method added to the protos is served with no change
here. Unary and server-streaming methods only: the protocols a browser's `fetch` can speak over
HTTP/1.1 (gRPC-Web, Connect) cannot send a request stream while a reply streams back, so
client-streaming and bidirectional methods (Interact, uploads) are answered `unimplemented`
with the gRPC port to use instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.message import DecodeError, Message


class CodecError(ValueError):
    """A request body that is not a message of the method's request type."""


@dataclass(frozen=True)
class Method:
    """One RPC as the gateway serves it: `/package.Service/Method` and its message types."""

    path: str
    server_streaming: bool
    client_streaming: bool
    request: type[Message]
    response: type[Message]

    def request_bytes(self, body: bytes, codec: str) -> bytes:
        """The request as binary protobuf, checked to be one whatever the codec."""
        msg = self.request()
        try:
            if codec == "json":
                json_format.Parse(body.decode() or "{}", msg)
            else:
                msg.ParseFromString(body)
        except (json_format.ParseError, DecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise CodecError(
                f"the body is not a {self.request.DESCRIPTOR.full_name}: {exc}"
            ) from None
        return bytes(msg.SerializeToString())

    def response_body(self, data: bytes, codec: str) -> bytes:
        """A reply from the gRPC server, in the caller's codec."""
        if codec != "json":
            return data
        msg = self.response.FromString(data)
        return json_format.MessageToJson(msg, indent=None).encode()


def served_methods(service_names: Iterable[str]) -> dict[str, Method]:
    """Every method of the named services (their descriptors must be imported), by path."""
    pool = descriptor_pool.Default()
    methods: dict[str, Method] = {}
    for name in service_names:
        service = pool.FindServiceByName(name)
        for m in service.methods:
            path = f"/{service.full_name}/{m.name}"
            methods[path] = Method(
                path,
                m.server_streaming,
                m.client_streaming,
                message_factory.GetMessageClass(m.input_type),
                message_factory.GetMessageClass(m.output_type),
            )
    return methods
