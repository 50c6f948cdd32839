"""The Connect and gRPC-Web framing (sandboxd.connect) and the gateway's reading of request
headers (sandboxd.web.protocols, .methods), without a server: every malformed input refused."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from sandboxd import connect
from sandboxd.config_sections.web import _origins_problem, origins
from sandboxd.server.transport import SERVICE_NAMES
from sandboxd.web.methods import CodecError, served_methods
from sandboxd.web.protocols import (
    CONNECT_STREAM,
    CONNECT_UNARY,
    GRPC_WEB,
    ProtocolError,
    check_connect_version,
    deadline_of,
    forwarded_metadata,
    protocol_of,
)


def test_envelopes_come_out_whole_from_any_pieces() -> None:
    data = connect.envelope(b"abc") + connect.envelope(b"", connect.FLAG_END_STREAM)
    reader = connect.EnvelopeReader(16)
    got = [frame for byte in data for frame in reader.feed(bytes([byte]))]
    assert got == [(0, b"abc"), (connect.FLAG_END_STREAM, b"")]
    reader.close()


def test_an_envelope_over_the_cap_is_refused_from_its_header() -> None:
    reader = connect.EnvelopeReader(16)
    with pytest.raises(connect.FramingError, match="over the 16 cap"):
        list(reader.feed(connect.HEADER.pack(0, 17)))  # the header alone: nothing buffered


def test_compressed_and_cut_envelopes_are_refused() -> None:
    with pytest.raises(connect.FramingError, match="compressed"):
        list(connect.EnvelopeReader(16).feed(connect.envelope(b"x", connect.FLAG_COMPRESSED)))
    reader = connect.EnvelopeReader(16)
    assert list(reader.feed(connect.envelope(b"abcd")[:6])) == []
    with pytest.raises(connect.FramingError, match="inside an envelope"):
        reader.close()


def test_a_callers_envelopes_carry_no_flags_and_each_refusal_has_its_code() -> None:
    """The one reader of both doors: what a caller sends carries no end-of-stream or trailers
    flag, and each refusal says the Connect code the door answers with."""
    caller = connect.EnvelopeReader(16, flags=0)
    with pytest.raises(connect.FramingError, match="flags 0x02") as flagged:
        list(caller.feed(connect.envelope(b"", connect.FLAG_END_STREAM)))
    assert flagged.value.code == "invalid_argument"
    with pytest.raises(connect.FramingError) as compressed:
        list(connect.EnvelopeReader(16).feed(connect.envelope(b"x", connect.FLAG_COMPRESSED)))
    assert compressed.value.code == "unimplemented"
    with pytest.raises(connect.FramingError) as large:
        list(connect.EnvelopeReader(16).feed(connect.HEADER.pack(0, 17)))
    assert large.value.code == "resource_exhausted"


def test_errors_carry_the_code_in_snake_case_and_the_error_info() -> None:
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason="SESSION_NOT_FOUND", domain="sandboxd"))
    status = status_pb2.Status(code=5, message="gone", details=[info])
    trailers = [("grpc-status-details-bin", status.SerializeToString())]
    details = connect.status_details(trailers)
    error = connect.connect_error(grpc.StatusCode.NOT_FOUND, "gone", details)
    assert error["code"] == "not_found" and error["details"][0]["type"] == "google.rpc.ErrorInfo"
    assert not error["details"][0]["value"].endswith("=")
    assert connect.connect_code(grpc.StatusCode.CANCELLED) == "canceled"
    assert connect.status_details([("grpc-status-details-bin", b"\xff\xff")]) is None
    end = connect.end_stream(error, {"k": ["v"]})
    assert end[0] == connect.FLAG_END_STREAM
    assert json.loads(end[5:]) == {"error": error, "metadata": {"k": ["v"]}}


def test_grpc_web_trailers_percent_encode_the_message() -> None:
    frame = connect.grpc_web_trailers(grpc.StatusCode.NOT_FOUND, "50% gone\nnow", [("a", "b")])
    assert frame[0] == connect.FLAG_TRAILERS
    assert frame[5:].decode() == "grpc-status: 5\r\ngrpc-message: 50%25 gone%0Anow\r\na: b\r\n"


@pytest.mark.parametrize(
    ("content_type", "kind", "codec", "text"),
    [
        ("application/proto", CONNECT_UNARY, "proto", False),
        ("application/json; charset=utf-8", CONNECT_UNARY, "json", False),
        ("application/connect+json", CONNECT_STREAM, "json", False),
        ("application/grpc-web", GRPC_WEB, "proto", False),
        ("application/grpc-web+json", GRPC_WEB, "json", False),
        ("application/grpc-web-text", GRPC_WEB, "proto", True),
    ],
)
def test_the_protocol_is_read_from_the_content_type(
    content_type: str, kind: str, codec: str, text: bool
) -> None:
    p = protocol_of(content_type)
    assert p is not None and (p.kind, p.codec, p.text) == (kind, codec, text)


@pytest.mark.parametrize(
    "content_type",
    [
        "",
        "text/plain",
        "application/grpc",
        "application/grpc-web+thrift",
        "application/x-www-form-urlencoded",
    ],
)
def test_other_content_types_are_not_spoken(content_type: str) -> None:
    assert protocol_of(content_type) is None


def test_deadlines_and_versions() -> None:
    web, unary = protocol_of("application/grpc-web"), protocol_of("application/json")
    assert web is not None and unary is not None
    assert deadline_of(web, {"grpc-timeout": "1500m"}) == 1.5
    assert deadline_of(unary, {"connect-timeout-ms": "250"}) == 0.25
    assert deadline_of(unary, {}) is None
    for bad in ({"grpc-timeout": "1x"}, {"grpc-timeout": "123456789S"}):
        with pytest.raises(ProtocolError):
            deadline_of(web, bad)
    with pytest.raises(ProtocolError):
        deadline_of(unary, {"connect-timeout-ms": "-1"})
    with pytest.raises(ProtocolError):
        check_connect_version(unary, {"connect-protocol-version": "2"})
    check_connect_version(unary, {"connect-protocol-version": "1"})


def test_only_credentials_and_trace_context_reach_the_server() -> None:
    headers = {"authorization": "Bearer t", "cookie": "s=1", "traceparent": "00-x", "x-a": "b"}
    assert forwarded_metadata(headers) == [("authorization", "Bearer t"), ("traceparent", "00-x")]


def test_methods_come_from_the_descriptors_and_check_their_bodies() -> None:
    methods = served_methods(SERVICE_NAMES)
    exec_ = methods["/sandboxd.v1.ProcessService/Exec"]
    assert exec_.server_streaming and not exec_.client_streaming
    assert methods["/sandboxd.v1.ProcessService/Interact"].client_streaming
    wire = exec_.request_bytes(b'{"sessionId": "s", "argv": ["echo"]}', "json")
    assert exec_.request.FromString(wire).argv == ["echo"]
    with pytest.raises(CodecError):
        exec_.request_bytes(b'{"nope": 1}', "json")
    with pytest.raises(CodecError):
        exec_.request_bytes(b"\xff\xff\xff", "proto")


def test_allowed_origins_are_origins() -> None:
    assert origins("https://A.example/, http://b:8080") == ("https://a.example", "http://b:8080")
    assert _origins_problem("*") is None
    assert _origins_problem("https://a.example/path") is not None
    assert _origins_problem("a.example") is not None


def test_the_gateway_is_refused_where_the_grpc_port_would_be(tmp_path: Path) -> None:
    """No authentication on a public web address, and no gateway where client certificates are
    required (it could not pass them on): both stop the server at start-up."""
    from sandboxd.config import Config, validate_access
    from sandboxd.errors import ConfigError

    validate_access(Config(web_listen="127.0.0.1:8080"))  # loopback, one tenant: as gRPC's
    with pytest.raises(ConfigError, match="web_listen.*without authentication"):
        validate_access(Config(web_listen="0.0.0.0:8080"))
    validate_access(Config(web_listen="0.0.0.0:8080", allow_insecure_public_listen=True))
    for name in ("cert", "key", "ca"):
        (tmp_path / name).write_text("x")
    tls = {
        "tls_cert": tmp_path / "cert",
        "tls_key": tmp_path / "key",
        "tls_client_ca": tmp_path / "ca",
    }
    with pytest.raises(ConfigError, match="client certificates"):
        validate_access(Config(web_listen="127.0.0.1:8080", **tls))
