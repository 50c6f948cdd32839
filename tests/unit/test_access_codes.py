"""The access log and the RPC histogram name a call the client cancelled CANCELLED, and keep
UNKNOWN for a servicer's own unhandled failure (an E2B watch closed by its SDK read UNKNOWN)."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from sandboxd.api.observe import MetricsInterceptor
from sandboxd.metrics import Metrics


class Context:
    def code(self) -> Any:
        return None


def _handler(**behaviors: Any) -> Any:
    fields = dict.fromkeys(("unary_unary", "unary_stream", "stream_unary", "stream_stream"))
    fields.update(behaviors)
    return SimpleNamespace(**fields, _replace=lambda **kw: SimpleNamespace(**{**fields, **kw}))


def _codes(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.code for r in caplog.records if getattr(r, "rpc", "") == "x.v1.S/M"]  # type: ignore[attr-defined]


def test_a_cancelled_stream_is_cancelled_and_a_failed_one_unknown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    layer = MetricsInterceptor(Metrics())
    details = SimpleNamespace(method="/x.v1.S/M")

    async def endless(request: Any, context: Any) -> Any:
        while True:
            yield b"x"
            await asyncio.sleep(0)

    async def broken(request: Any, context: Any) -> Any:
        yield b"x"
        raise RuntimeError("a bug")

    async def main() -> None:
        stream = layer.wrap(_handler(unary_stream=endless), details).unary_stream
        items = stream(SimpleNamespace(), Context())
        await items.__anext__()
        await items.aclose()  # the client went away
        failing = layer.wrap(_handler(unary_stream=broken), details).unary_stream
        with pytest.raises(RuntimeError):
            async for _ in failing(SimpleNamespace(), Context()):
                pass

    with caplog.at_level(logging.INFO, logger="sandboxd.access"):
        asyncio.run(main())
    assert _codes(caplog) == ["CANCELLED", "UNKNOWN"]
