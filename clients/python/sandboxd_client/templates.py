"""Templates: TemplateService (BuildTemplate, GetTemplate, ListTemplates, DeleteTemplate), as
a mixin of SandboxClient, with their typed results."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Self

from sandboxd_client._call_end import CallEnd
from sandboxd_client._convert import timestamp
from sandboxd_client._lazy import lazy
from sandboxd_client._rpc import UNSET, rpc

if TYPE_CHECKING:
    from sandboxd_client._gen.sandboxd.v1 import template_pb2, template_pb2_grpc
else:  # loaded on first use (sandboxd_client._lazy)
    template_pb2 = lazy("sandboxd_client._gen.sandboxd.v1.template_pb2")
    template_pb2_grpc = lazy("sandboxd_client._gen.sandboxd.v1.template_pb2_grpc")

CONTEXT_CHUNK = 256 * 1024
_STATES = ("BUILDING", "READY", "FAILED")  # TemplateState's values, without the prefix


def _state_name(value: template_pb2.TemplateState.ValueType) -> str:
    try:
        name = template_pb2.TemplateState.Name(value).removeprefix("TEMPLATE_STATE_")
    except ValueError:  # a state newer than these stubs
        return "UNSPECIFIED"
    return name if name in _STATES else "UNSPECIFIED"


@dataclasses.dataclass(frozen=True)
class Template:
    name: str
    state: str  # BUILDING, READY or FAILED
    builtin: bool
    size_bytes: int
    created_at: dt.datetime | None = None
    message: str = ""

    @classmethod
    def from_pb(cls, m: template_pb2.Template) -> Self:
        return cls(
            m.name,
            _state_name(m.state),
            m.builtin,
            m.size_bytes,
            timestamp(m, "create_time"),
            m.message,
        )


@dataclasses.dataclass(frozen=True)
class BuildLogLine:
    """One line of a template build's log."""

    line: str


Context = bytes | Iterable[bytes] | AsyncIterable[bytes]


async def _requests(
    name: str, dockerfile: str, context: Context
) -> AsyncIterator[template_pb2.BuildTemplateRequest]:
    yield template_pb2.BuildTemplateRequest(
        spec=template_pb2.TemplateSpec(name=name, dockerfile=dockerfile)
    )
    if isinstance(context, bytes):
        for i in range(0, len(context), CONTEXT_CHUNK):
            yield template_pb2.BuildTemplateRequest(context=context[i : i + CONTEXT_CHUNK])
    elif isinstance(context, AsyncIterable):
        async for chunk in context:
            yield template_pb2.BuildTemplateRequest(context=chunk)
    else:
        for chunk in context:
            yield template_pb2.BuildTemplateRequest(context=chunk)


class TemplatesMixin:
    """SandboxClient's template calls: build from a Dockerfile, look up, list, delete."""

    channel: Any
    _server_stream: Callable[..., AsyncIterator[Any]]
    _unary: Callable[..., Awaitable[Any]]
    _paged: Callable[..., AsyncIterator[Any]]

    @property
    def _templates(self) -> template_pb2_grpc.TemplateServiceStub:
        return template_pb2_grpc.TemplateServiceStub(self.channel)

    @rpc("TemplateService/BuildTemplate")
    async def build_template(
        self,
        name: str,
        dockerfile: str,
        context: Context = b"",
        *,
        timeout: float | None = None,
    ) -> AsyncIterator[BuildLogLine | Template]:
        """Build `name` from a Dockerfile and a tar build context (bytes or chunks): the
        build's log lines as they come, then the READY Template."""
        stub = self._templates
        ends = CallEnd()  # a build refused early ends the call: stop reading `context`
        async for resp in self._server_stream(
            lambda t: stub.BuildTemplate(
                ends.until_ended(_requests(name, dockerfile, context)), timeout=t
            ),
            timeout,
            ends=ends,
        ):
            if resp.WhichOneof("event") == "done":
                yield Template.from_pb(resp.done.template)
            else:
                yield BuildLogLine(resp.log.line)

    @rpc("TemplateService/GetTemplate")
    async def get_template(self, name: str, *, timeout: float | None = UNSET) -> Template:
        req = template_pb2.GetTemplateRequest(name=name)
        stub = self._templates
        resp = await self._unary(
            "TemplateService/GetTemplate", lambda t: stub.GetTemplate(req, timeout=t), timeout
        )
        return Template.from_pb(resp.template)

    @rpc("TemplateService/ListTemplates")
    async def list_templates(
        self, *, page_size: int = 0, timeout: float | None = UNSET
    ) -> AsyncIterator[Template]:
        """The built-in templates and the caller's own, by name (pages followed)."""
        stub = self._templates
        async for page in self._paged(
            "TemplateService/ListTemplates",
            lambda token, t: stub.ListTemplates(
                template_pb2.ListTemplatesRequest(page_size=page_size, page_token=token),
                timeout=t,
            ),
            timeout,
        ):
            for m in page.templates:
                yield Template.from_pb(m)

    @rpc("TemplateService/DeleteTemplate")
    async def delete_template(self, name: str, *, timeout: float | None = UNSET) -> None:
        """Refused (TEMPLATE_IN_USE) while a live session runs it."""
        req = template_pb2.DeleteTemplateRequest(name=name)
        stub = self._templates
        await self._unary(
            "TemplateService/DeleteTemplate", lambda t: stub.DeleteTemplate(req, timeout=t), timeout
        )


__all__ = ["BuildLogLine", "Template", "TemplatesMixin"]
