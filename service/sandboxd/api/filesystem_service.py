"""FilesystemService: translate messages, delegate to Files."""

from __future__ import annotations

from sandboxd.api import convert
from sandboxd.api.errors import Ctx, unary
from sandboxd.files import Files
from sandboxd.sessions import SessionManager
from sandboxd.v1 import filesystem_pb2, filesystem_pb2_grpc


class FilesystemService(filesystem_pb2_grpc.FilesystemServiceServicer):
    def __init__(self, sessions: SessionManager, files: Files) -> None:
        self._sessions = sessions
        self._files = files

    @unary
    async def ReadFile(
        self, request: filesystem_pb2.ReadFileRequest, context: Ctx
    ) -> filesystem_pb2.ReadFileResponse:
        async with self._sessions.use(request.session_id) as session:
            got = await self._files.read(session, request.path)
        return filesystem_pb2.ReadFileResponse(content=got.content, mode=got.mode, size=got.size)

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
        return filesystem_pb2.ListDirResponse(entries=[convert.file_info_pb(e) for e in entries])

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
            info = await self._files.make_dir(session, request.path, request.parents)
        return filesystem_pb2.MakeDirResponse(info=convert.file_info_pb(info))
