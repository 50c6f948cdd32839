"""A command's audit record comes from where it runs: the process manager's CommandStarted and
CommandExited, on the fake engine. What the record says (argv, the resolved cwd, the bytes of
each stream as the server read them, the exit), that a StartProcess retried with its
request_id makes one record, that an Exec its caller left is recorded killed, and that over a
real gRPC server the `exited` reply waits for the record's acknowledgement, as a refusal's
status waits for its record."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from audit_world import HeldWriter, Recorder, Writer, audited_server, hello_session
from sandboxd import domain_events as de
from sandboxd.audit.subscriber import AuditSubscriber
from sandboxd.config import Config
from sandboxd.exec_spec import ExecRequestInput, prepare
from sandboxd.execution import Executor
from sandboxd.metrics import Metrics
from sandboxd.models import (
    ExecEvent,
    ExecExited,
    ExecOutput,
    ExecSpec,
    ExecStarted,
    OutputStream,
    ShellPolicy,
)
from sandboxd.processes import ProcessManager, ProcessOrigin
from sandboxd.v1 import process_pb2, process_pb2_grpc


def _session(tmp_path: Path) -> contextlib.AbstractAsyncContextManager[Any]:
    return hello_session(tmp_path, shell=ShellPolicy(allow=("cat",)))


async def _records(events: list[de.DomainEvent], method: str) -> Writer:
    """The records the audit subscriber makes of `events`, emitted inside a call of `method`."""
    writer = Writer()
    subscriber = AuditSubscriber(writer)  # type: ignore[arg-type]

    async def call() -> None:
        scope = de.CallScope(method, "cd" * 16)
        de.CURRENT_SCOPE.set(scope)
        for event in events:
            subscriber(event)
        await scope.settle()
        scope.close()

    await asyncio.create_task(call())
    return writer


async def _events(*items: ExecEvent) -> AsyncIterator[ExecEvent]:
    for item in items:
        yield item


async def test_a_runs_record_is_made_from_its_exit_with_the_resolved_cwd(tmp_path: Path) -> None:
    observer = Recorder()
    async with _session(tmp_path) as (st, session):
        executor = Executor(st.commands)
        pm = ProcessManager(executor, observer)
        asked = ExecRequestInput(argv=["cat", "hello.txt"], cwd="./sub/")
        spec = prepare(session, asked, Config().limits.max)
        async for _ in pm.track("s1", spec, ProcessOrigin.RUN, executor.stream(session, spec)):
            pass
    (exited,) = [e for e in observer.events if isinstance(e, de.CommandExited)]
    assert (exited.stdout_bytes, exited.stderr_bytes, exited.exit_code) == (6, 0, 0)
    writer = await _records([exited], "ProcessService/Run")
    (record,) = writer.acknowledged
    attrs = dict(record.attributes)
    assert float(attrs.pop("duration_s")) >= 0
    assert attrs == {
        "argv": '["cat", "hello.txt"]',
        "cwd": "/workspace/sub",  # as resolved, not as given
        "process_id": exited.process_id,
        "exit_code": "0",
        "timed_out": "false",
        "truncated": "false",
        "stdout_bytes": "6",
        "stderr_bytes": "0",
        "method": "ProcessService/Run",
    }
    assert (record.kind, record.session_id, record.trace_id) == ("command", "s1", "cd" * 16)


async def test_exec_and_interact_records_keep_their_output_bytes_and_pty() -> None:
    observer = Recorder()
    pm = ProcessManager(executor=None, observer=observer)  # type: ignore[arg-type]
    spec = ExecSpec(["sh"], "/workspace", {}, b"", 5.0, 1 << 20)
    out = _events(
        ExecStarted("p-1"),
        ExecOutput(OutputStream.STDOUT, b"abc", 0),
        ExecOutput(OutputStream.STDERR, b"de", 0),
        ExecExited(2, "", False, True, 0.25),
    )
    async for _ in pm.track("s1", spec, ProcessOrigin.INTERACT, out, pty=True):
        pass
    (exited,) = [e for e in observer.events if isinstance(e, de.CommandExited)]
    (record,) = (await _records([exited], "ProcessService/Interact")).acknowledged
    assert record.attributes["output_bytes"] == "5"
    assert (record.attributes["stdout_bytes"], record.attributes["stderr_bytes"]) == ("3", "2")
    assert record.attributes["pty"] == "true" and record.attributes["truncated"] == "true"
    assert record.attributes["duration_s"] == "0.250"


async def test_a_start_process_retried_with_its_request_id_makes_one_record(
    tmp_path: Path,
) -> None:
    observer = Recorder()
    async with _session(tmp_path) as (st, session):
        pm = ProcessManager(Executor(st.commands), observer)
        spec = ExecSpec(["cat", "hello.txt"], "/workspace/sub", {}, b"", 5.0, 1 << 20)
        first = await pm.start(session, spec, "r-abc", request_id="key-1")
        again = await pm.start(session, spec, "r-abc", request_id="key-1")
        assert again is first and first.task is not None
        await first.task
    starts = [e for e in observer.events if isinstance(e, de.CommandStarted)]
    assert len(starts) == 1
    writer = await _records(list(observer.events), "ProcessService/StartProcess")
    (start,) = writer.acknowledged  # the call's own record: the start, once
    assert start.attributes["request_id"] == "key-1"
    assert start.attributes["background"] == "true" and "exit_code" not in start.attributes
    (end,) = writer.queued  # its exit is no call's: queued, never deferred
    assert end.attributes["exit_code"] == "0" and end.attributes["stdout_bytes"] == "6"
    assert "method" not in end.attributes


async def test_an_exec_its_caller_left_is_recorded_killed_with_what_it_wrote() -> None:
    observer = Recorder()
    pm = ProcessManager(executor=None, observer=observer)  # type: ignore[arg-type]
    spec = ExecSpec(["yes"], "/workspace", {}, b"", 5.0, 1 << 20)
    out = _events(
        ExecStarted("p-2"),
        ExecOutput(OutputStream.STDOUT, b"y\n", 0),
        ExecOutput(OutputStream.STDOUT, b"y\n", 2),
    )
    stream = pm.track("s1", spec, ProcessOrigin.EXEC, out)
    await anext(stream)
    await anext(stream)
    await stream.aclose()
    (exited,) = [e for e in observer.events if isinstance(e, de.CommandExited)]
    assert (exited.exit_code, exited.signal, exited.stdout_bytes) == (137, "SIGKILL", 2)


async def test_the_metrics_follow_the_command_events() -> None:
    m = Metrics()
    pm = ProcessManager(executor=None, observer=de.FanOut([m.observe]))  # type: ignore[arg-type]
    spec = ExecSpec(["sh"], "/workspace", {}, b"", 5.0, 1 << 20)
    out = _events(ExecStarted("p-3"), ExecOutput(OutputStream.STDOUT, b"x" * 7, 0))
    async for _ in pm.track("s1", spec, ProcessOrigin.RUN, out):
        pass
    text = m.render().decode()
    assert 'sandboxd_tenant_output_bytes_total{tenant="default"} 7.0' in text
    assert 'sandboxd_tenant_events_total{kind="command",tenant="default"} 1.0' in text
    assert 'sandboxd_tenant_command_seconds_count{tenant="default"} 1.0' in text


# ----- over a real gRPC server --------------------------------------------------------------


class _Exec(process_pb2_grpc.ProcessServiceServicer):
    """An Exec whose events pass through the process manager's `track`, as the servicer's do."""

    def __init__(self, observer: de.Observer) -> None:
        self._pm = ProcessManager(executor=None, observer=observer)  # type: ignore[arg-type]

    async def Exec(  # noqa: N802
        self, request: process_pb2.ExecRequest, context: object
    ) -> AsyncIterator[process_pb2.ExecResponse]:
        spec = ExecSpec(list(request.argv), "/workspace", {}, b"", 5.0, 1 << 20)
        out = _events(
            ExecStarted("p-4"),
            ExecOutput(OutputStream.STDOUT, b"hi\n", 0),
            ExecExited(0, "", False, False, 0.1),
        )
        async for event in self._pm.track(request.session_id, spec, ProcessOrigin.EXEC, out):
            if isinstance(event, ExecStarted):
                yield process_pb2.ExecResponse(started={"process_id": event.process_id})
            elif isinstance(event, ExecOutput):
                yield process_pb2.ExecResponse(output={"data": event.data})
            elif isinstance(event, ExecExited):
                yield process_pb2.ExecResponse(exited={"exit_code": event.exit_code})

    async def Run(  # noqa: N802
        self, request: process_pb2.RunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> process_pb2.RunResponse:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "not allowed")
        raise AssertionError("abort raises")


def _served(writer: Writer, metrics: Metrics) -> contextlib.AbstractAsyncContextManager[Any]:
    observer = de.FanOut([AuditSubscriber(writer), metrics.observe])  # type: ignore[arg-type]
    add = process_pb2_grpc.add_ProcessServiceServicer_to_server
    return audited_server(observer, add, _Exec(observer), process_pb2_grpc.ProcessServiceStub)


async def test_an_execs_exited_reply_waits_for_its_record() -> None:
    writer = HeldWriter()
    async with _served(writer, Metrics()) as stub:
        traced = (("traceparent", f"00-{'ab' * 16}-00f067aa0ba902b7-01"),)
        call = stub.Exec(process_pb2.ExecRequest(session_id="s1", argv=["echo"]), metadata=traced)
        kinds = [(await call.read()).WhichOneof("event") for _ in range(2)]
        assert kinds == ["started", "output"]
        exited = asyncio.ensure_future(call.read())
        await asyncio.sleep(0.3)
        assert not exited.done()  # the record is not acknowledged: the outcome is held
        writer.release.set()
        assert (await exited).WhichOneof("event") == "exited"
    (record,) = writer.acknowledged
    assert record.kind == "command" and record.attributes["method"] == "ProcessService/Exec"
    assert record.attributes["output_bytes"] == "3" and record.trace_id == "ab" * 16


async def test_a_refusal_is_the_edges_event_recorded_and_counted() -> None:
    writer, metrics = Writer(), Metrics()
    async with _served(writer, metrics) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Run(process_pb2.RunRequest(session_id="s9", argv=["rm"]))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    (record,) = writer.acknowledged
    assert (record.kind, record.session_id) == ("refused", "s9")
    assert record.attributes["code"] == "PERMISSION_DENIED"
    assert record.attributes["method"] == "ProcessService/Run"
    text = metrics.render().decode()
    assert 'sandboxd_tenant_events_total{kind="refused",tenant="default"} 1.0' in text
