"""Each stand-in of the test layer typed as the protocol it stands in for.

The unit layer runs the domain over these (the engine, its disks, the snapshot archive, an
exec's stream, the agent channel's transport, the preview dialer). `make lint` type-checks this
module with mypy --strict, so a protocol that gains or changes a member fails the lint until its
stand-in follows, rather than a test failing later, or passing by duck typing on a member no
test calls.
"""

from __future__ import annotations

from agent_peer import MemoryTransport
from agent_pipes import PipeTransport
from fakes import FakeArchive, FakeDisks, FakeEngine, FakeExecStream
from preview_world import LoopbackDialer
from sandboxd.agent.transport import Transport
from sandboxd.engine.protocol import Engine, ExecStream
from sandboxd.previews.dialer import PortDialer
from sandboxd.snapshots import WorkspaceArchive
from sandboxd.storage.disks import Disks


def engine(fake: FakeEngine) -> Engine:
    return fake


def disks(fake: FakeDisks) -> Disks:
    return fake


def archive(fake: FakeArchive) -> WorkspaceArchive:
    return fake


def exec_stream(fake: FakeExecStream) -> ExecStream:
    return fake


def memory_transport(fake: MemoryTransport) -> Transport:
    return fake


def pipe_transport(fake: PipeTransport) -> Transport:
    return fake


def dialer(fake: LoopbackDialer) -> PortDialer:
    return fake
