"""Every RPC's replies have a bound (api/reply_bounds.py), walked from the service descriptors,
and the net under them all (api/reply_limit.py) refuses a reply message over the caller's limit
with a status the caller can read, over a real gRPC channel with DEFAULT options."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from sandboxd.api import replies
from sandboxd.api.reply_bounds import REPLY_BOUNDS, Bound
from sandboxd.api.reply_limit import ReplyLimit
from sandboxd.api.session_leases import LeaseEcho
from sandboxd.api.session_lifecycle import SessionLifecycleRpcs
from sandboxd.leases.terms import LeaseTermsStore
from sandboxd.server.transport import SERVICE_NAMES
from sandboxd.sessions import CreateSessionInput
from sandboxd.v1 import (
    admin_pb2,
    audit_pb2,
    filesystem_pb2,
    process_pb2,
    session_pb2,
    snapshot_pb2,
    template_pb2,
    volumes_pb2,
)
from session_stack import session_stack

MiB = 1024 * 1024
_FILES = (
    admin_pb2,
    audit_pb2,
    filesystem_pb2,
    process_pb2,
    session_pb2,
    snapshot_pb2,
    template_pb2,
    volumes_pb2,
)


def _methods() -> Iterator[MethodDescriptor]:
    for module in _FILES:
        for service in module.DESCRIPTOR.services_by_name.values():
            assert service.full_name in SERVICE_NAMES
            yield from service.methods


METHODS = {f"{m.containing_service.full_name}/{m.name}": m for m in _methods()}


def test_every_rpc_of_every_service_says_what_bounds_its_replies() -> None:
    assert len({m.containing_service.full_name for m in METHODS.values()}) == len(SERVICE_NAMES)
    assert set(METHODS) - set(REPLY_BOUNDS) == set(), "an RPC without a reply bound"
    assert set(REPLY_BOUNDS) - set(METHODS) == set(), "a bound for an RPC that is not served"


@pytest.mark.parametrize("name", sorted(REPLY_BOUNDS))
def test_each_bound_matches_its_rpc(name: str) -> None:
    method, bound = METHODS[name], REPLY_BOUNDS[name]
    request, reply = method.input_type, method.output_type
    takes_limit = replies.FIELD in request.fields_by_name
    # The RPCs whose replies grow with what a sandbox holds take the caller's limit, and only they.
    assert takes_limit == (bound.kind in (Bound.CUT, Bound.REFUSED, Bound.PAGED)), name
    if takes_limit:
        assert request.fields_by_name[replies.FIELD].type == FieldDescriptor.TYPE_INT64
    streams = bound.kind in (Bound.CHUNKED, Bound.EVENTS)
    assert method.server_streaming == streams, name
    if streams:
        assert 0 < bound.per_message <= replies.MIN_REPLY_BYTES, name
    if bound.kind is Bound.PAGED:
        assert {"page_size", "page_token"} <= set(request.fields_by_name), name
        items = reply.fields_by_name[bound.items]
        assert items.is_repeated, name
        assert items.type == FieldDescriptor.TYPE_MESSAGE, name
        assert "next_page_token" in reply.fields_by_name, name


def test_limits_default_to_grpcs_and_stay_within_the_servers() -> None:
    assert replies.limit_for(0, 17 * MiB) == 4 * MiB == 4194304
    assert replies.limit_for(64 * MiB, 17 * MiB) == 17 * MiB
    assert replies.limit_for(1, 17 * MiB) == replies.MIN_REPLY_BYTES
    assert replies.limit_for(8 * MiB, 17 * MiB) == 8 * MiB
    with pytest.raises(Exception, match="max_reply_bytes"):
        replies.limit_for(-1, 17 * MiB)


def test_run_output_is_cut_to_the_serialized_size_both_streams_together() -> None:
    for lossy in (False, True):
        reply = process_pb2.RunResponse(
            stdout=b"\xff" * (9 * MiB), stderr=b"e" * (9 * MiB), exit_code=3, truncated=True
        )

        def text(r: process_pb2.RunResponse, on: bool = lossy) -> None:
            if on:
                r.stdout_text = r.stdout.decode("utf-8", "replace")
                r.stderr_text = r.stderr.decode("utf-8", "replace")

        text(reply)
        assert replies.cut_to_fit(reply, ("stdout", "stderr"), 4 * MiB, text)
        assert reply.ByteSize() <= 4 * MiB and reply.exit_code == 3
        assert reply.ByteSize() > 4 * MiB - 64  # as much as fits, not less
        assert abs(len(reply.stdout) - len(reply.stderr)) <= 1


async def test_a_page_is_cut_to_fit_and_its_token_continues_after_it() -> None:
    from sandboxd import paging

    ids = [f"s{i:04d}" for i in range(300)]
    labels = {f"k{i:02d}" + "x" * 120: "v" * 256 for i in range(64)}  # the most a session has

    async def fetch(token: str, size: int) -> session_pb2.ListSessionsResponse:
        chosen, nxt = paging.page(ids, str, paging.page_size(size), token, "t")
        return session_pb2.ListSessionsResponse(
            sessions=[session_pb2.Session(session_id=i, labels=labels) for i in chosen],
            next_page_token=nxt,
        )

    seen: list[str] = []
    token = ""
    while True:
        got = await replies.fitted_page(lambda n, t=token: fetch(t, n), "sessions", 1000)
        assert got.ByteSize() <= 4 * MiB
        seen += [s.session_id for s in got.sessions]
        token = got.next_page_token
        if not token:
            break
    assert seen == ids


async def test_list_sessions_with_many_labels_pages_within_a_default_client(
    tmp_path: Path,
) -> None:
    """The largest labels a session may carry, on 200 sessions: one 1000-session page would
    be about 5 MB."""
    labels = {f"k{i:02d}" + "x" * 120: "v" * 256 for i in range(64)}
    async with session_stack(tmp_path) as st:
        for i in range(200):
            await st.sessions.create(CreateSessionInput(session_id=f"s{i:03d}", labels=labels))
        terms = await LeaseTermsStore(st.store.db).open()
        rpcs = SessionLifecycleRpcs(st.sessions, LeaseEcho(terms))
        seen: list[str] = []
        token = ""
        pages = 0
        while True:
            got = await rpcs.ListSessions(
                session_pb2.ListSessionsRequest(page_size=1000, page_token=token)
            )
            assert got.ByteSize() <= 4 * MiB
            seen += [s.session_id for s in got.sessions]
            pages += 1
            token = got.next_page_token
            if not token:
                break
        assert pages >= 2 and sorted(seen) == [f"s{i:03d}" for i in range(200)]


# ----- the net, over a real channel with gRPC's default options -----------------------------

_SIZES = {"small": 100, "big": 5 * MiB}
_seen_limits: list[int] = []


def _reply(request: process_pb2.RunRequest) -> process_pb2.RunResponse:
    _seen_limits.append(replies.current())
    return process_pb2.RunResponse(stdout=b"x" * _SIZES[request.cwd], exit_code=7)


async def _unary(request: process_pb2.RunRequest, context: Any) -> process_pb2.RunResponse:
    return _reply(request)


async def _server_stream(
    request: process_pb2.RunRequest, context: Any
) -> AsyncIterator[process_pb2.RunResponse]:
    yield _reply(process_pb2.RunRequest(cwd="small"))
    yield _reply(request)


async def _client_stream(requests: Any, context: Any) -> process_pb2.RunResponse:
    received = [r async for r in requests]
    return _reply(received[-1])


async def _bidi(requests: Any, context: Any) -> AsyncIterator[process_pb2.RunResponse]:
    async for request in requests:
        yield _reply(request)


@pytest.fixture
async def net() -> AsyncIterator[str]:
    rq, rs = process_pb2.RunRequest.FromString, process_pb2.RunResponse.SerializeToString
    handler = grpc.method_handlers_generic_handler(
        "test.Net",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(_unary, rq, rs),
            "ServerStream": grpc.unary_stream_rpc_method_handler(_server_stream, rq, rs),
            "ClientStream": grpc.stream_unary_rpc_method_handler(_client_stream, rq, rs),
            "Bidi": grpc.stream_stream_rpc_method_handler(_bidi, rq, rs),
        },
    )
    server = grpc.aio.server(
        interceptors=[ReplyLimit(17 * MiB)],
        options=[("grpc.max_send_message_length", 17 * MiB)],
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(None)


def _reason(err: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None, f"not the server's status: {err.code()} {err.details()}"
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    return info.reason


def _calls(channel: grpc.aio.Channel) -> dict[str, Any]:
    rq, rs = process_pb2.RunRequest.SerializeToString, process_pb2.RunResponse.FromString
    return {
        "Unary": channel.unary_unary("/test.Net/Unary", rq, rs),
        "ServerStream": channel.unary_stream("/test.Net/ServerStream", rq, rs),
        "ClientStream": channel.stream_unary("/test.Net/ClientStream", rq, rs),
        "Bidi": channel.stream_stream("/test.Net/Bidi", rq, rs),
    }


async def _call(calls: dict[str, Any], kind: str, request: process_pb2.RunRequest) -> list[Any]:
    if kind == "Unary":
        return [await calls[kind](request)]
    if kind == "ServerStream":
        return [m async for m in calls[kind](request)]
    if kind == "ClientStream":
        return [await calls[kind](iter([request]))]
    return [m async for m in calls[kind](iter([request]))]


@pytest.mark.parametrize("kind", ["Unary", "ServerStream", "ClientStream", "Bidi"])
async def test_a_reply_over_the_limit_is_the_servers_refusal_not_the_clients(
    net: str, kind: str
) -> None:
    async with grpc.aio.insecure_channel(net) as channel:  # default options: 4 MiB
        calls = _calls(channel)
        small = await _call(calls, kind, process_pb2.RunRequest(cwd="small"))
        assert small[-1].exit_code == 7
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _call(calls, kind, process_pb2.RunRequest(cwd="big"))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _reason(caught.value) == "REPLY_TOO_LARGE"


async def test_a_request_that_accepts_more_gets_more_and_a_negative_one_is_refused(
    net: str,
) -> None:
    options = [("grpc.max_receive_message_length", 64 * MiB)]
    async with grpc.aio.insecure_channel(net, options=options) as channel:
        calls = _calls(channel)
        _seen_limits.clear()
        got = await _call(
            calls, "Unary", process_pb2.RunRequest(cwd="big", max_reply_bytes=8 * MiB)
        )
        assert len(got[0].stdout) == 5 * MiB and _seen_limits == [8 * MiB]
        _seen_limits.clear()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _call(calls, "Unary", process_pb2.RunRequest(cwd="small", max_reply_bytes=-1))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert _seen_limits == []  # refused before the servicer ran
