"""FilesystemService: translate messages, delegate to Files, FileTransfer and DirWatches."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from sandboxd.api import convert, replies
from sandboxd.api.errors import Ctx, stream, unary
from sandboxd.config_sections import WatchSection
from sandboxd.dir_watch import DirWatches
from sandboxd.errors import InvalidArgument, ResourceExhausted
from sandboxd.file_transfer import FileTransfer
from sandboxd.files import Files
from sandboxd.models import FileInfo
from sandboxd.reasons import Reason
from sandboxd.sessions import SessionManager
from sandboxd.v1 import filesystem_pb2, filesystem_pb2_grpc, watch_pb2

# ReadFileResponse's fields besides `content` (mode, size, size_bytes: varints), with room over.
_READ_REPLY_OTHERS_BYTES = 64


async def _data(
    requests: AsyncIterator[filesystem_pb2.WriteFileStreamRequest],
) -> AsyncIterator[bytes]:
    async for req in requests:
        if req.HasField("header"):
            raise InvalidArgument(
                "WriteFileStream: only the first message may carry a header",
                reason=Reason.INVALID_ARGUMENT,
            )
        if req.data:
            yield req.data


class FilesystemService(filesystem_pb2_grpc.FilesystemServiceServicer):
    def __init__(
        self,
        sessions: SessionManager,
        files: Files,
        transfer: FileTransfer | None = None,
        watches: DirWatches | None = None,
    ) -> None:
        self._sessions = sessions
        self._files = files
        self._transfer = transfer or FileTransfer(files.helper)
        self._watches = watches or DirWatches(files.helper, sessions, WatchSection())

    @unary
    async def ReadFile(
        self, request: filesystem_pb2.ReadFileRequest, context: Ctx
    ) -> filesystem_pb2.ReadFileResponse:
        room = replies.room_for_content(replies.current(), _READ_REPLY_OTHERS_BYTES)
        async with self._sessions.use(request.session_id) as session:
            got = await self._files.read(session, request.path, room)
        return filesystem_pb2.ReadFileResponse(
            content=got.content, mode=got.mode, size=got.size, size_bytes=got.size
        )

    @unary
    async def WriteFile(
        self, request: filesystem_pb2.WriteFileRequest, context: Ctx
    ) -> filesystem_pb2.WriteFileResponse:
        async with self._sessions.use(request.session_id) as session:
            info = await self._files.write(
                session, request.path, request.content, request.mode, request.make_parents
            )
        return filesystem_pb2.WriteFileResponse(info=convert.file_info_pb(info))

    @unary
    async def ListDir(
        self, request: filesystem_pb2.ListDirRequest, context: Ctx
    ) -> filesystem_pb2.ListDirResponse:
        async with self._sessions.use(request.session_id) as session:
            entries = await self._files.list_dir(session, request.path, request.depth)
        bound = f"listdir {session.session_id} {request.path!r} {request.depth}"

        def reply(chosen: Sequence[FileInfo], token: str) -> filesystem_pb2.ListDirResponse:
            return filesystem_pb2.ListDirResponse(
                entries=[convert.file_info_pb(e) for e in chosen], next_page_token=token
            )

        def whole(size: int, limit: int) -> ResourceExhausted:
            return ResourceExhausted(
                f"the listing of {request.path or '.'!r} would be a {size}-byte reply, over the "
                f"{limit} bytes this caller accepts (max_reply_bytes; 4 MiB when unset): ask for "
                "pages (page_size), or list a narrower folder or fewer levels (depth)",
                reason=Reason.LISTING_TOO_LARGE,
                metadata={"path": request.path, "limit": str(limit), "size": str(size)},
            )

        return await replies.held_page(
            entries, lambda e: e.path, request, bound, reply, "entries", whole
        )

    @unary
    async def Stat(
        self, request: filesystem_pb2.StatRequest, context: Ctx
    ) -> filesystem_pb2.StatResponse:
        async with self._sessions.use(request.session_id) as session:
            info = await self._files.stat(session, request.path)
        return filesystem_pb2.StatResponse(info=convert.file_info_pb(info))

    @unary
    async def Remove(
        self, request: filesystem_pb2.RemoveRequest, context: Ctx
    ) -> filesystem_pb2.RemoveResponse:
        async with self._sessions.use(request.session_id) as session:
            await self._files.remove(session, request.path, request.recursive)
        return filesystem_pb2.RemoveResponse()

    @unary
    async def MakeDir(
        self, request: filesystem_pb2.MakeDirRequest, context: Ctx
    ) -> filesystem_pb2.MakeDirResponse:
        async with self._sessions.use(request.session_id) as session:
            parents = request.make_parents or request.parents
            info = await self._files.make_dir(session, request.path, parents)
        return filesystem_pb2.MakeDirResponse(info=convert.file_info_pb(info))

    @stream
    async def ReadFileStream(
        self, request: filesystem_pb2.ReadFileStreamRequest, context: Ctx
    ) -> AsyncGenerator[filesystem_pb2.ReadFileStreamResponse, None]:
        async with self._sessions.use(request.session_id) as session:
            chunks = self._transfer.read(session, request.path, request.offset, request.length)
            async for offset, data in chunks:
                # Filled in place: a submessage passed as a keyword is merged, copying data again.
                response = filesystem_pb2.ReadFileStreamResponse()
                response.chunk.data = data
                response.chunk.offset = offset
                yield response

    @unary
    async def WriteFileStream(
        self, request: AsyncIterator[filesystem_pb2.WriteFileStreamRequest], context: Ctx
    ) -> filesystem_pb2.WriteFileStreamResponse:
        requests = aiter(request)
        first = await anext(requests, None)
        if first is None or not first.HasField("header"):
            raise InvalidArgument(
                "WriteFileStream: the first message must carry the header",
                reason=Reason.INVALID_FIRST_MESSAGE,
            )
        h = first.header
        async with self._sessions.use(h.session_id) as session:
            info = await self._transfer.write(
                session, h.path, h.mode, h.make_parents, _data(requests)
            )
        return filesystem_pb2.WriteFileStreamResponse(info=convert.file_info_pb(info))

    @unary
    async def Move(
        self, request: filesystem_pb2.MoveRequest, context: Ctx
    ) -> filesystem_pb2.MoveResponse:
        async with self._sessions.use(request.session_id) as session:
            info = await self._transfer.move(
                session, request.source_path, request.destination_path, request.overwrite
            )
        return filesystem_pb2.MoveResponse(info=convert.file_info_pb(info))

    @stream
    async def WatchDir(
        self, request: watch_pb2.WatchDirRequest, context: Ctx
    ) -> AsyncGenerator[filesystem_pb2.WatchDirResponse, None]:
        # No workspace gate: a watch may last for hours, and a snapshot must not wait for it.
        async with self._sessions.use(request.session_id, gate=False) as session:
            async with self._watches.watch(session, request.path, request.recursive) as events:
                await context.send_initial_metadata((("sandboxd-watch", "ready"),))
                async for event in events:
                    yield filesystem_pb2.WatchDirResponse(event=convert.file_event_pb(event))
