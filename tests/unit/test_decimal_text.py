"""Every number read from text someone else wrote is ASCII 0-9, or refused in its protocol's
words: a superscript digit (`str.isdigit()` says yes, `int()` says no; a latin-1 header carries
"²" as the one byte 0xB2) or another script's digits never surface as a stray ValueError (a 500,
a dropped stream) and are never read as a number the next hop would refuse."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from sandboxd import digits
from sandboxd.agent.byte_stream import peer_of
from sandboxd.agent.memory import budget_of_container
from sandboxd.e2b import connect, wire
from sandboxd.e2b.asgi import Request, TooLarge
from sandboxd.e2b.pty import Ptys
from sandboxd.e2b.rest import Rest, RestError
from sandboxd.events.stats import workspace_used
from sandboxd.execution import parse_status
from sandboxd.settings import host_port_problem
from sandboxd.web.protocols import ProtocolError, deadline_of, protocol_of

# Each is taken by `str.isdigit()`; the first three are refused by `int()`, the last is read by
# it as 12 though no HTTP peer or JSON codec would.
NOT_ASCII = ["²", "¹²", "1³", "١٢"]


@pytest.mark.parametrize("text", NOT_ASCII + ["", " 1", "1 ", "+1", "-1", "1_0", "0x1", "1.0"])
def test_only_ascii_digits_are_a_decimal(text: str) -> None:
    assert digits.decimal(text) is None


def test_a_decimal_has_at_most_its_digits() -> None:
    assert digits.decimal("0") == 0
    assert digits.decimal("0042") == 42
    assert digits.decimal("9" * 19) == 10**19 - 1
    assert digits.decimal("1" * 20) is None
    assert digits.decimal("123", max_digits=2) is None


@pytest.mark.parametrize("text", NOT_ASCII)
def test_e2b_json_string_integers_are_refused_as_invalid(text: str) -> None:
    with pytest.raises(connect.ConnectError) as err:
        wire.uint({"pid": text}, "pid")
    assert err.value.code == "invalid_argument"


@pytest.mark.parametrize("text", NOT_ASCII)
def test_e2b_connect_timeout_is_refused_as_invalid(text: str) -> None:
    with pytest.raises(connect.ConnectError) as err:
        connect.timeout_s(text)
    assert err.value.code == "invalid_argument"


def _request(query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None) -> Request:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"method": "GET", "path": "/sandboxes", "query_string": query}
    return Request({**scope, "headers": headers or []}, receive, 1 << 20)


class _NoSessions:
    async def ListSessions(self, req: Any, metadata: Any = None) -> Any:  # noqa: N802
        raise AssertionError("a refused limit lists nothing")


@pytest.mark.parametrize("limit", [b"%C2%B2", b"%D9%A1%D9%A2", b"1%C2%B3"])
def test_e2b_list_limit_is_a_400(limit: bytes) -> None:
    rest = Rest(SimpleNamespace(sessions=_NoSessions()), None, "")  # type: ignore[arg-type]
    with pytest.raises(RestError) as err:
        asyncio.run(rest._list("key", _request(b"limit=" + limit), paged=True))
    assert err.value.status == 400


def test_e2b_content_length_that_is_no_number_does_not_raise() -> None:
    """The declared length is a hint checked before reading; a malformed one is no hint."""
    request = _request(headers=[(b"content-length", b"\xb2")])
    assert asyncio.run(request.body()) == b""
    with pytest.raises(TooLarge):
        asyncio.run(_request(headers=[(b"content-length", b"99999999")]).body())


@pytest.mark.parametrize("rows, cols", [(2**32, 80), (24, 2**32), (10_001, 80), (24, 2**40)])
def test_e2b_pty_size_at_start_is_bounded_like_a_resize(rows: int, cols: int) -> None:
    class Refuse:
        def Interact(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802
            raise AssertionError("a refused size starts nothing")

    ptys = Ptys(SimpleNamespace(processes=Refuse()), 60, 60)  # type: ignore[arg-type]

    async def start() -> None:
        async for _ in ptys.start("key", "s-1", 1000, ["sh"], "/workspace", {}, rows, cols):
            pass

    with pytest.raises(connect.ConnectError) as err:
        asyncio.run(start())
    assert err.value.code == "invalid_argument"
    assert not ptys.has("s-1", 1000)


@pytest.mark.parametrize("text", NOT_ASCII)
def test_gateway_connect_timeout_is_a_protocol_error(text: str) -> None:
    protocol = protocol_of("application/json")
    assert protocol is not None
    with pytest.raises(ProtocolError):
        deadline_of(protocol, {"connect-timeout-ms": text})


@pytest.mark.parametrize("text", NOT_ASCII)
def test_an_agent_peer_with_odd_digits_is_malformed(text: str) -> None:
    assert peer_of({"peer": f"127.0.0.1:{text}"}) is None


@pytest.mark.parametrize("text", NOT_ASCII)
def test_a_status_answer_with_odd_digits_is_no_signal(text: str) -> None:
    assert parse_status(f"signal {text}".encode()) == 0


class _Df:
    """A sandbox whose `df` answers what the test says (the sandbox's side is not trusted)."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer

    @contextlib.asynccontextmanager
    async def open(self, where: Any, command: Any) -> AsyncIterator[Any]:
        chunks = [(1, self.answer), None]

        class Stream:
            async def read(self) -> Any:
                return chunks.pop(0)

        yield Stream()


@pytest.mark.parametrize("text", NOT_ASCII)
def test_a_df_answer_with_odd_digits_is_no_usage(text: str) -> None:
    answer = f"Filesystem 1024-blocks Used Available\ntmpfs 100 {text} 1 /workspace\n".encode()
    session = SimpleNamespace(container_id="c", spec=SimpleNamespace(user="1000:1000"))
    assert asyncio.run(workspace_used(_Df(answer), session)) == 0  # type: ignore[arg-type]
    plain = b"Filesystem 1024-blocks Used Available\ntmpfs 100 7 93 /workspace\n"
    assert asyncio.run(workspace_used(_Df(plain), session)) == 7 * 1024  # type: ignore[arg-type]


@pytest.mark.parametrize("text", NOT_ASCII)
def test_a_workspace_size_with_odd_digits_is_not_read(text: str) -> None:
    odd = {"Memory": 256 << 20, "Tmpfs": {"/workspace": f"size={text}"}}
    none = {"Memory": 256 << 20, "Tmpfs": {}}
    assert budget_of_container(odd) == budget_of_container(none)


@pytest.mark.parametrize("text", NOT_ASCII)
def test_a_setting_port_with_odd_digits_is_a_problem(text: str) -> None:
    assert host_port_problem(f"127.0.0.1:{text}", "127.0.0.1:50051") is not None
