"""sandboxd.tracing: spans of a traced port, its interface kept, and no wrapper when off."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracer
from sandboxd.tracing import provider_for, traced, tracer_of


class Port:
    def __init__(self) -> None:
        self.collaborator: object = None
        self.count = 0

    async def call(self, x: int) -> int:
        self.count += 1
        return x * 2

    @contextlib.asynccontextmanager
    async def stream(self) -> AsyncIterator[str]:
        yield "open"

    def plain(self) -> str:
        return "plain"


def _recording() -> tuple[InMemorySpanExporter, TracerProvider]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter, provider


def test_coroutines_and_streams_are_spans_and_the_rest_passes_through() -> None:
    exporter, provider = _recording()
    inner = Port()
    port = traced(inner, tracer_of(provider), "engine")

    async def use() -> None:
        assert await port.call(2) == 4
        async with port.stream() as opened:
            assert opened == "open"
        assert port.plain() == "plain"

    asyncio.run(use())
    port.collaborator = "set later"  # lands on the wrapped object
    assert inner.collaborator == "set later" and port.count == 1
    names = [s.name for s in exporter.get_finished_spans()]
    assert names == ["engine.call", "engine.stream"]


def test_without_an_endpoint_nothing_is_wrapped() -> None:
    assert provider_for("") is None
    tracer = tracer_of(None)
    assert isinstance(tracer, NoOpTracer)
    inner = Port()
    assert traced(inner, tracer, "engine") is inner
