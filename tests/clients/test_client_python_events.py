"""The Python client's audit, event, stats and lease-terms surface against a real server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from conftest import ServerProcess
from sandboxd_client import AuditEvent, SandboxClient, SessionEvent, SessionStats, errors


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[SandboxClient]:
    async with SandboxClient(server.address, timeout=60) as c:
        yield c


async def test_audit_events_session_events_stats_and_lease_terms(client: SandboxClient) -> None:
    session = await client.create_session(
        allow_all=True, on_expiry="suspend", renew_on_activity=True, lease_ttl=600
    )
    sid = session.id
    try:
        info = await client.get_session(sid)
        assert (info.info.on_expiry, info.info.renew_on_activity) == ("SUSPEND", True)
        assert info.info.end_reason == ""

        events: list[SessionEvent] = []

        async def watch() -> None:
            async for e in client.watch_session(sid):
                events.append(e)
                if e.kind == "PROCESS_EXITED":
                    return

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.3)
        await session.run(["sh", "-c", "echo hi"])
        await asyncio.wait_for(watcher, 20)
        assert events[0].kind == "STATE_CHANGED" and events[-1].kind == "PROCESS_EXITED"
        assert all(isinstance(e, SessionEvent) for e in events)

        stats = await client.get_session_stats(sid)
        assert isinstance(stats, SessionStats) and stats.memory_bytes > 0

        audited = [e async for e in client.list_audit_events(session_id=sid, kinds=["command"])]
        assert [type(e) for e in audited] == [AuditEvent]
        assert json.loads(audited[0].attributes["argv"]) == ["sh", "-c", "echo hi"]
        with pytest.raises(errors.SandboxError) as bad:
            [e async for e in client.list_audit_events(kinds=["nope"])]
        assert bad.value.reason == "INVALID_AUDIT_KIND"
        with pytest.raises(ValueError):
            await client.create_session(on_expiry="sometimes")
    finally:
        await client.session(sid).delete()
