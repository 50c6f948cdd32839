"""The E2B door's pure parts without a server: Connect framing, the user model's paths, access
tokens, and refusals of malformed input, each with a clear code and nothing else touched."""

from __future__ import annotations

import base64
import json
import re
import struct
from pathlib import Path

import pytest
from sandboxd.e2b import connect, wire
from sandboxd.e2b.app import _check_user
from sandboxd.e2b.backend import check_api_key, loopback_target
from sandboxd.e2b.connect import ConnectError, JsonMessages
from sandboxd.e2b.rest import _metadata_filter
from sandboxd.e2b.tokens import AccessTokens, load_key
from sandboxd.validation.identity import SESSION_ID_RE


def frame(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def test_envelopes_round_trip_across_any_cut() -> None:
    body = connect.envelope({"a": 1}) + connect.envelope({"b": "x" * 1000})
    for cut in range(len(body) + 1):
        reader = JsonMessages(4096)
        got = reader.feed(body[:cut]) + reader.feed(body[cut:])
        reader.finish()
        assert got == [{"a": 1}, {"b": "x" * 1000}]


def test_end_stream_carries_the_error() -> None:
    raw = connect.end_stream(ConnectError("not_found", "gone"))
    flags, size = struct.unpack(">BI", raw[:5])
    assert flags == connect.FLAG_END_STREAM and size == len(raw) - 5
    assert json.loads(raw[5:]) == {"error": {"code": "not_found", "message": "gone"}}
    assert json.loads(connect.end_stream()[5:]) == {}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (frame(b"{}", flags=0x01), "unimplemented"),  # compressed: not offered
        (frame(b"{}", flags=0x02), "invalid_argument"),  # end-of-stream from a client
        (frame(b"{}", flags=0x80), "invalid_argument"),
        (frame(b"not json"), "invalid_argument"),
        (frame(b"[1, 2]"), "invalid_argument"),
        (frame(b"\xff\xfe"), "invalid_argument"),
        (struct.pack(">BI", 0, 10**9), "resource_exhausted"),  # refused before it is read
    ],
)
def test_malformed_frames_are_refused_with_a_code(body: bytes, code: str) -> None:
    with pytest.raises(ConnectError) as err:
        JsonMessages(1024).feed(body)
    assert err.value.code == code


def test_a_body_cut_inside_a_frame_is_refused() -> None:
    reader = JsonMessages(1024)
    assert reader.feed(frame(b'{"a": 1}')[:-2]) == []
    with pytest.raises(ConnectError) as err:
        reader.finish()
    assert err.value.code == "invalid_argument"


def test_connect_codes_and_http_statuses() -> None:
    import grpc

    assert connect.code_of(grpc.StatusCode.NOT_FOUND) == "not_found"
    assert connect.code_of(grpc.StatusCode.ALREADY_EXISTS) == "already_exists"
    assert connect.code_of(grpc.StatusCode.DEADLINE_EXCEEDED) == "deadline_exceeded"
    assert ConnectError("unauthenticated", "").http_status == 401
    assert ConnectError("not_found", "").http_status == 404
    assert ConnectError("resource_exhausted", "").http_status == 429
    # Connect spells it with one l; a call cancelled behind the door is 499, never a 500.
    assert connect.code_of(grpc.StatusCode.CANCELLED) == "canceled"
    assert ConnectError(connect.code_of(grpc.StatusCode.CANCELLED), "").http_status == 499


@pytest.mark.parametrize("header", ["-1", "1.5", "12345678901", "abc", ""])
def test_bad_timeouts_are_refused(header: str) -> None:
    with pytest.raises(ConnectError):
        connect.timeout_s(header)
    assert connect.timeout_s("1500") == 1.5 and connect.timeout_s(None) is None


@pytest.mark.parametrize(
    ("e2b", "workspace"),
    [
        ("/home/user", "/workspace"),
        ("/home/user/a/b.txt", "/workspace/a/b.txt"),
        ("a/b.txt", "/workspace/a/b.txt"),
        ("", "/workspace"),
        ("~/x", "/workspace/x"),
        # Passed on unchanged, for sandboxd's own rules to refuse:
        ("/etc/passwd", "/etc/passwd"),
        ("/home/username", "/home/username"),
        ("../x", "/workspace/../x"),
    ],
)
def test_home_paths_map_onto_the_workspace_and_widen_nothing(e2b: str, workspace: str) -> None:
    assert wire.to_workspace(e2b) == workspace


def test_workspace_paths_read_back_as_home() -> None:
    assert wire.to_home("/workspace/a") == "/home/user/a"
    assert wire.to_home("a") == "/home/user/a"
    assert wire.to_home(".") == "/home/user"
    assert wire.to_home("/workspacex") == "/workspacex"


def test_json_codec_values() -> None:
    assert wire.field({"exitCode": 3}, "exit_code") == 3
    assert wire.uint({"pid": "42"}, "pid") == 42
    assert wire.data({"stdin": base64.b64encode(b"\x00hi").decode()}, "stdin") == b"\x00hi"
    assert wire.data({"stdin": "AP8"}, "stdin") == b"\x00\xff"  # unpadded
    for bad in ({"pid": -1}, {"pid": True}, {"pid": "x"}, {"pid": 2.5}):
        with pytest.raises(ConnectError):
            wire.uint(bad, "pid")
    with pytest.raises(ConnectError):
        wire.data({"stdin": "!!!"}, "stdin")
    with pytest.raises(ConnectError):
        wire.string_map({"envs": {"a": 1}}, "envs")


def test_access_tokens_open_only_for_their_sandbox(tmp_path: Path) -> None:
    tokens = AccessTokens(load_key(tmp_path))
    token = tokens.issue("ione", "alpha-key")
    assert tokens.open("ione", token) == "alpha-key"
    forged = _flip_last_byte(token)
    for sid, tok in (("itwo", token), ("ione", forged), ("ione", ""), ("ione", None)):
        with pytest.raises(ConnectError) as err:
            tokens.open(sid, tok)
        assert err.value.code == "unauthenticated"
    with pytest.raises(ConnectError):
        tokens.open("ione", "x" * 10_000)


def _flip_last_byte(token: str) -> str:
    raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    raw[-1] ^= 1
    return base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


def test_a_token_has_one_spelling(tmp_path: Path) -> None:
    """Base64's unused low bits in the last character give each token several spellings that
    decode to the same bytes; only the one issued opens, so a token is its string."""
    tokens = AccessTokens(load_key(tmp_path))
    token = tokens.issue("ione", "alpha-key")  # 37 bytes: the last character carries 2 bits
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    same_bytes = [
        token[:-1] + c
        for c in alphabet
        if c != token[-1] and alphabet.index(c) >> 4 == alphabet.index(token[-1]) >> 4
    ]
    assert len(same_bytes) == 15
    for spelling in same_bytes:
        with pytest.raises(ConnectError) as err:
            tokens.open("ione", spelling)
        assert err.value.code == "unauthenticated"


def test_the_sealing_key_outlives_a_restart_and_is_private(tmp_path: Path) -> None:
    token = AccessTokens(load_key(tmp_path)).issue("ione", "k")
    assert AccessTokens(load_key(tmp_path)).open("ione", token) == "k"
    assert (tmp_path / "e2b-token-key").stat().st_mode & 0o077 == 0


DNS_LABEL = re.compile(r"\A[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")


@pytest.mark.parametrize("session", ["s-0123456789abcdef", "alpha.s-0123456789abcdef", "t-1.x"])
def test_sandbox_ids_are_dns_labels_and_map_back(session: str) -> None:
    sandbox = wire.sandbox_id(session)
    assert DNS_LABEL.match(sandbox), sandbox
    assert wire.session_id(sandbox) == session
    assert SESSION_ID_RE.match(session)


@pytest.mark.parametrize("key", [None, "", "a b", "tab\tkey", "x" * 513, "caf\u00e9"])
def test_api_keys_that_cannot_be_a_bearer_token_are_refused(key: str | None) -> None:
    with pytest.raises(ConnectError) as err:
        check_api_key(key)
    assert err.value.code == "unauthenticated"


def test_only_the_user_named_user_runs() -> None:
    _check_user(None)
    _check_user("Basic " + base64.b64encode(b"user:").decode())
    with pytest.raises(ConnectError) as err:
        _check_user("Basic " + base64.b64encode(b"root:").decode())
    assert err.value.code == "permission_denied"
    with pytest.raises(ConnectError):
        _check_user("Basic !!!")


def test_metadata_filter_and_loopback_target() -> None:
    assert _metadata_filter("a=1&b=x%2520y") == {"a": "1", "b": "x y"}
    assert _metadata_filter("a=1&b=2") == {"a": "1", "b": "2"}
    assert loopback_target("0.0.0.0:50051", 7) == "127.0.0.1:7"
    assert loopback_target("[::]:1", 7) == "[::1]:7"
    assert loopback_target("10.0.0.1:1", 7) == "10.0.0.1:7"


def test_envd_is_routed_by_header_or_by_host(tmp_path: Path) -> None:
    import grpc
    from sandboxd.e2b.app import E2bApp
    from sandboxd.e2b.asgi import Request
    from sandboxd.e2b.backend import Backend

    async def no_body() -> dict[str, object]:
        return {"type": "http.request", "body": b""}

    async def check() -> None:
        app = E2bApp(
            Backend(grpc.aio.insecure_channel("127.0.0.1:9")),  # never dialled here
            AccessTokens(load_key(tmp_path)),
            domain="sbx.example.com",
            max_request_bytes=1024,
            command_timeout_s=60,
            pty_idle_s=60,
        )

        def request(**headers: str) -> Request:
            scope = {
                "type": "http",
                "method": "POST",
                "path": "/files",
                "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()],
            }
            return Request(scope, no_body, 1024)

        assert app._sandbox_of(request(e2b_sandbox_id="alpha--s-1")) == "alpha.s-1"
        assert app._sandbox_of(request(host="49983-alpha--s-1.sbx.example.com")) == "alpha.s-1"
        assert app._sandbox_of(request(host="49983-x.sbx.example.com:443")) == "x"
        assert app._sandbox_of(request(host="8080-x.sbx.example.com")) is None
        assert app._sandbox_of(request(host="49983-x.evil.example.com")) is None
        assert app._sandbox_of(request(host="49983-x.y.sbx.example.com")) is None

    import asyncio

    asyncio.run(check())


def test_a_public_door_needs_authentication() -> None:
    from sandboxd.config import Config, validate_access
    from sandboxd.errors import ConfigError

    validate_access(Config(e2b_listen="127.0.0.1:3000"))
    with pytest.raises(ConfigError, match="e2b_listen"):
        validate_access(Config(e2b_listen="0.0.0.0:3000"))
    validate_access(Config(e2b_listen="0.0.0.0:3000", allow_insecure_public_listen=True))
