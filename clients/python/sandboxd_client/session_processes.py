"""Session calls on processes by handle: one handle for every process (GetProcess)
and more stdin for a background process (SendProcessInput, CloseProcessStdin).

A mixin of `Session`, kept apart so session.py stays one screenful per concern.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandboxd_client._gen.sandboxd.v1 import process_pb2
from sandboxd_client._rpc import UNSET, rpc
from sandboxd_client.events import ProcessInfo

if TYPE_CHECKING:
    from sandboxd_client.client import SandboxClient


class ProcessHandles:
    """GetProcess, SendProcessInput and CloseProcessStdin for `Session`."""

    _client: SandboxClient

    @property
    def id(self) -> str:
        raise NotImplementedError

    @property
    def _stubs(self) -> Any:
        return self._client.stubs

    @rpc("ProcessService/GetProcess")
    async def get_process(self, process_id: str, *, timeout: float | None = UNSET) -> ProcessInfo:
        """Any process by the id Exec, Run, Interact or StartProcess reported."""
        req = process_pb2.GetProcessRequest(session_id=self.id, process_id=process_id)
        resp = await self._client._unary(
            "ProcessService/GetProcess",
            lambda t: self._stubs.processes.GetProcess(req, timeout=t),
            timeout,
        )
        return ProcessInfo.from_pb(resp.process)

    @rpc("ProcessService/SendProcessInput")
    async def send_input(
        self, process_id: str, data: bytes, *, timeout: float | None = UNSET
    ) -> None:
        """More stdin for a process started with `keep_stdin_open=True` (never retried: the
        bytes would be written twice)."""
        req = process_pb2.SendProcessInputRequest(
            session_id=self.id, process_id=process_id, data=data
        )
        await self._client._unary(
            "ProcessService/SendProcessInput",
            lambda t: self._stubs.processes.SendProcessInput(req, timeout=t),
            timeout,
        )

    @rpc("ProcessService/CloseProcessStdin")
    async def close_stdin(self, process_id: str, *, timeout: float | None = UNSET) -> None:
        """End of file on the process's stdin; closing twice is fine."""
        req = process_pb2.CloseProcessStdinRequest(session_id=self.id, process_id=process_id)
        await self._client._unary(
            "ProcessService/CloseProcessStdin",
            lambda t: self._stubs.processes.CloseProcessStdin(req, timeout=t),
            timeout,
        )
