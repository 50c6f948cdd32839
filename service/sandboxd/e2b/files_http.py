"""envd's `/files`: GET reads a file, POST writes one or more (multipart or octet-stream).

Both stream through ReadFileStream and WriteFileStream: a read is relayed chunk by chunk, an
octet-stream upload is written as it arrives, a multipart upload part by part as python-multipart
cuts it. Every body is bounded by the door's `max_request_bytes` (413 past it) and every file
by the server's own file size limit (the gRPC server's refusal, as for any client).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from sandboxd.e2b.asgi import Request, Send, end_stream, start_stream, stream_chunk
from sandboxd.e2b.backend import Backend, metadata
from sandboxd.e2b.envd_files import entry
from sandboxd.e2b.wire import HOME, to_workspace
from sandboxd.v1 import filesystem_pb2

_QUEUE = 8  # chunks between the body's reader and one part's upload


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _user(request: Request) -> None:
    user = request.arg("username")
    if user not in (None, "", "user"):
        raise HttpError(403, f"sandboxd runs everything as `user`, not {user!r}")


class FilesHttp:
    def __init__(self, backend: Backend) -> None:
        self._b = backend

    async def read(self, key: str, sid: str, request: Request, send: Send) -> None:
        _user(request)
        path = to_workspace(request.arg("path") or "")
        call = self._b.files.ReadFileStream(
            filesystem_pb2.ReadFileStreamRequest(session_id=sid, path=path),
            metadata=metadata(key),
        )
        replies = aiter(call)
        # The first chunk before the head: a refusal (no such file, a path outside) is still
        # an HTTP status; once the body has begun only cutting it short can tell the client.
        first = await anext(replies, None)
        await start_stream(send, 200, "application/octet-stream")
        if first is not None:
            await stream_chunk(send, first.chunk.data)
            async for r in replies:
                await stream_chunk(send, r.chunk.data)
        await end_stream(send)

    async def write(self, key: str, sid: str, request: Request) -> list[dict[str, Any]]:
        _user(request)
        if request.header("content-encoding") not in (None, "", "identity"):
            raise HttpError(415, "compressed uploads are not supported")
        from python_multipart.multipart import parse_options_header  # with the first upload

        kind, params = parse_options_header(request.header("content-type") or "")
        if kind == b"application/octet-stream":
            path = request.arg("path")
            if not path:
                raise HttpError(400, "path is required")
            return [await self._upload(key, sid, path, request.chunks())]
        if kind != b"multipart/form-data" or b"boundary" not in params:
            raise HttpError(400, "expected multipart/form-data or application/octet-stream")
        return await self._multipart(key, sid, request, params[b"boundary"])

    async def _upload(
        self, key: str, sid: str, path: str, chunks: AsyncIterator[bytes]
    ) -> dict[str, Any]:
        """One file through WriteFileStream. A body that fails (over the limit, the client
        gone) cancels the call, so the server drops its temporary file: never a file cut
        short in the workspace."""
        failed: list[Exception] = []

        async def messages() -> AsyncIterator[filesystem_pb2.WriteFileStreamRequest]:
            yield filesystem_pb2.WriteFileStreamRequest(
                header=filesystem_pb2.WriteFileStreamHeader(
                    session_id=sid, path=to_workspace(path), make_parents=True
                )
            )
            try:
                async for chunk in chunks:
                    for i in range(0, len(chunk), 1 << 20):
                        yield filesystem_pb2.WriteFileStreamRequest(data=chunk[i : i + (1 << 20)])
            except Exception as exc:  # the body's own failure: TooLarge, Disconnected, ...
                failed.append(exc)
                call.cancel()

        call = self._b.files.WriteFileStream(messages(), metadata=metadata(key))
        try:
            got = await call
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            task = asyncio.current_task()
            if failed and not (task is not None and task.cancelling()):
                raise failed[0] from None
            raise
        return _written(entry(got.info))

    async def _multipart(
        self, key: str, sid: str, request: Request, boundary: bytes
    ) -> list[dict[str, Any]]:
        """Each part a file, its name (filename) the path; the query's path for a nameless
        one. A part's bytes go to its upload through a bounded queue, so at most a few chunks
        are held whatever the part's size."""
        results: list[dict[str, Any]] = []
        state: dict[str, Any] = {"field": b"", "headers": {}, "queue": None, "task": None}
        pending: list[bytes | None] = []

        def on_header_field(data: bytes, start: int, end: int) -> None:
            state["field"] += data[start:end]

        def on_header_value(data: bytes, start: int, end: int) -> None:
            name = state["field"].lower()
            state["headers"][name] = state["headers"].get(name, b"") + data[start:end]

        def on_header_end() -> None:
            state["field"] = b""

        def on_headers_finished() -> None:
            pending.append(b"\x00begin")

        def on_part_data(data: bytes, start: int, end: int) -> None:
            pending.append(bytes(data[start:end]))

        def on_part_end() -> None:
            pending.append(None)

        from python_multipart.multipart import MultipartParser

        parser = MultipartParser(
            boundary,
            {
                "on_header_field": on_header_field,
                "on_header_value": on_header_value,
                "on_header_end": on_header_end,
                "on_headers_finished": on_headers_finished,
                "on_part_data": on_part_data,
                "on_part_end": on_part_end,
            },
        )
        queue: asyncio.Queue[bytes | None] | None = None
        task: asyncio.Task[dict[str, Any]] | None = None
        try:
            async for chunk in request.chunks():
                parser.write(chunk)
                for item in pending:
                    if item == b"\x00begin":
                        path = _part_path(state["headers"], request.arg("path"))
                        state["headers"] = {}
                        queue = asyncio.Queue(_QUEUE)
                        task = asyncio.create_task(self._upload(key, sid, path, _from_queue(queue)))
                    elif queue is not None and task is not None:
                        await _put(queue, item, task)
                        if item is None:
                            results += [await task]
                            queue, task = None, None
                pending.clear()
            parser.finalize()
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if not results:
            raise HttpError(400, "the multipart body holds no file")
        return results


async def _put(
    queue: asyncio.Queue[bytes | None], item: bytes | None, task: asyncio.Task[Any]
) -> None:
    """Hand one chunk to an upload, or learn that the upload ended first (its error)."""
    put = asyncio.ensure_future(queue.put(item))
    await asyncio.wait({put, task}, return_when=asyncio.FIRST_COMPLETED)
    if not put.done():
        put.cancel()
        await task  # raises the upload's error
        raise HttpError(500, "the upload ended early")


async def _from_queue(queue: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
    while (item := await queue.get()) is not None:
        yield item


def _part_path(headers: dict[bytes, bytes], default: str | None) -> str:
    from python_multipart.multipart import parse_options_header

    _, params = parse_options_header(headers.get(b"content-disposition", b""))
    name = params.get(b"filename")
    path = name.decode("utf-8", "replace") if name else (default or "")
    if not path:
        raise HttpError(400, "a multipart part has no file name and the query no path")
    if not path.startswith("/") and default and default.startswith("/") and not name:
        return default
    return path if path.startswith("/") else f"{HOME}/{path}"


def _written(e: dict[str, Any]) -> dict[str, Any]:
    """envd's answer to a write: name, type and path ("file", not the enum's name)."""
    return {"name": e["name"], "type": "file", "path": e["path"]}
