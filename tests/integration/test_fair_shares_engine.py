"""Fair shares on the real engine: while another tenant is active, a tenant flooding the server
with calls is refused (RESOURCE_EXHAUSTED, TENANT_RATE_LIMITED, RetryInfo) before anything is
done, and the other tenant's Run is served. No timing is asserted: the server is given a share
so small (1 call a second, a burst of 6, a 60 s contention window) that 24 calls started at once
must be refused but for the burst, however slow the machine."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

import grpc
from conftest import Stubs, error_info
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from sandboxd.v1 import common_pb2, process_pb2, session_pb2
from two_tenants import two_tenant_fixtures

BURST = 6
STORM = 24
ALL = common_pb2.ShellPolicy(allow_all=True)
T = TypeVar("T")


server, stubs = two_tenant_fixtures(
    "fair",
    "--admission-calls-per-s",
    "1",
    "--admission-call-burst",
    str(BURST),
    "--admission-contention-window",
    "60s",
)


def _retry_delay_s(err: grpc.RpcError) -> float:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            return float(retry.retry_delay.ToNanoseconds()) / 1e9
    raise AssertionError(f"no RetryInfo on {err}")


def test_a_flooding_tenant_is_refused_with_retry_info_while_the_other_tenant_runs(
    stubs: dict[str, Stubs],
) -> None:
    flood, calm = stubs["flood"], stubs["calm"]
    # Each tenant's calls: the flood's create is made alone (never refused); the bystander's
    # calls (create, two Runs, delete) fit its own burst.
    fsid = flood.sessions.CreateSession(session_pb2.CreateSessionRequest(shell=ALL)).session
    csid = calm.sessions.CreateSession(session_pb2.CreateSessionRequest(shell=ALL)).session
    try:
        run = calm.processes.Run(process_pb2.RunRequest(session_id=csid.session_id, argv=["true"]))
        assert run.exit_code == 0
        # A start storm, all at once: at most the burst (and what a second adds) is started.
        storm: list[Future[process_pb2.StartProcessResponse]] = [
            flood.processes.StartProcess.future(
                process_pb2.StartProcessRequest(session_id=fsid.session_id, argv=["sleep", "60"])
            )
            for _ in range(STORM)
        ]
        begun = time.monotonic()
        started, refused = [], []
        for call in storm:
            try:
                started.append(call.result(timeout=120).process.process_id)
            except grpc.RpcError as err:
                refused.append(err)
        elapsed = time.monotonic() - begun
        assert refused, "no call of the storm was refused"
        assert len(started) <= BURST + int(elapsed) + 1  # the burst, and 1 a second
        for err in refused:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()  # type: ignore[attr-defined]
            info = error_info(err)
            assert info.reason == "TENANT_RATE_LIMITED" and info.domain == "sandboxd"
            assert info.metadata["tenant"] == "flood"
            assert 0 < _retry_delay_s(err) <= 1.0  # one token at 1 call/s
        # The bystander is served while the flood is held to its share.
        run = calm.processes.Run(
            process_pb2.RunRequest(session_id=csid.session_id, argv=["echo", "served"])
        )
        assert run.exit_code == 0 and run.stdout == b"served\n"
    finally:
        calm.sessions.DeleteSession(session_pb2.DeleteSessionRequest(session_id=csid.session_id))
    # A refused start started nothing: only the admitted ones are the flood's processes. A
    # client that waits as RetryInfo says is served.
    listed = _honouring_retry_info(
        lambda: flood.processes.ListProcesses(
            process_pb2.ListProcessesRequest(session_id=fsid.session_id)
        )
    )
    assert sorted(p.process_id for p in listed.processes) == sorted(started)


def _honouring_retry_info(call: Callable[[], T]) -> T:
    for _ in range(30):
        try:
            return call()
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:  # type: ignore[attr-defined]
                raise
            time.sleep(_retry_delay_s(err))
    raise AssertionError("still refused after 30 waits of RetryInfo's delay")
