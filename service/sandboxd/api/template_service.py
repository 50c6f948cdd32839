"""TemplateService: proto <-> sandboxd.templates."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from sandboxd.api import replies
from sandboxd.api.errors import Ctx, stream, unary
from sandboxd.api.limits import ended_by_the_client, idle_limited
from sandboxd.errors import InvalidArgument
from sandboxd.reasons import Reason
from sandboxd.templates.builds import BuildLog, Templates
from sandboxd.templates.store import TemplateRecord
from sandboxd.v1 import template_pb2, template_pb2_grpc

_STATES = {
    "BUILDING": template_pb2.TEMPLATE_STATE_BUILDING,
    "READY": template_pb2.TEMPLATE_STATE_READY,
    "FAILED": template_pb2.TEMPLATE_STATE_FAILED,
}


def template_pb(t: TemplateRecord) -> template_pb2.Template:
    pb = template_pb2.Template(
        name=t.name,
        state=_STATES[t.state.value],
        builtin=t.builtin,
        size_bytes=t.size_bytes,
        message=t.message,
    )
    pb.create_time.FromDatetime(t.created_at)
    return pb


def _spec_error(message: str) -> InvalidArgument:
    return InvalidArgument(message, reason=Reason.TEMPLATE_SPEC_INVALID)


async def _context(
    requests: AsyncIterator[template_pb2.BuildTemplateRequest],
) -> AsyncIterator[bytes]:
    async for req in requests:
        if req.WhichOneof("payload") != "context":
            raise _spec_error("after `spec`, BuildTemplate messages carry `context` only")
        yield req.context


class TemplateService(template_pb2_grpc.TemplateServiceServicer):
    def __init__(self, templates: Templates, idle_s: float) -> None:
        self._templates = templates
        self._idle_s = idle_s  # a stalled upload must not hold a build slot

    @stream
    async def BuildTemplate(
        self, request: AsyncIterator[template_pb2.BuildTemplateRequest], context: Ctx
    ) -> AsyncGenerator[template_pb2.BuildTemplateResponse, None]:
        # The build starts at the context's end: only for a client that closed it.
        requests = aiter(idle_limited(request, self._idle_s, ended_by_the_client(context)))
        try:
            first = await anext(requests)
        except StopAsyncIteration:
            raise _spec_error("the first BuildTemplate message must be `spec` (got none)") from None
        if first.WhichOneof("payload") != "spec":
            raise _spec_error("the first BuildTemplate message must be `spec`")
        events = self._templates.build(first.spec.name, first.spec.dockerfile, _context(requests))
        async for event in events:
            if isinstance(event, BuildLog):
                yield template_pb2.BuildTemplateResponse(
                    log=template_pb2.BuildLogLine(line=event.line)
                )
            else:
                yield template_pb2.BuildTemplateResponse(
                    done=template_pb2.BuildTemplateDone(template=template_pb(event))
                )

    @unary
    async def GetTemplate(
        self, request: template_pb2.GetTemplateRequest, context: Ctx
    ) -> template_pb2.GetTemplateResponse:
        return template_pb2.GetTemplateResponse(
            template=template_pb(await self._templates.get(request.name))
        )

    @unary
    async def ListTemplates(
        self, request: template_pb2.ListTemplatesRequest, context: Ctx
    ) -> template_pb2.ListTemplatesResponse:
        async def page(size: int) -> template_pb2.ListTemplatesResponse:
            found, token = await self._templates.list(size, request.page_token)
            return template_pb2.ListTemplatesResponse(
                templates=[template_pb(t) for t in found], next_page_token=token
            )

        return await replies.fitted_page(page, "templates", request.page_size)

    @unary
    async def DeleteTemplate(
        self, request: template_pb2.DeleteTemplateRequest, context: Ctx
    ) -> template_pb2.DeleteTemplateResponse:
        await self._templates.delete(request.name)
        return template_pb2.DeleteTemplateResponse()
