"""Session stats (GetSessionStats) and the feed events derived from resource use: OOM kills
(the engine's event stream), workspace nearly full and CPU throttling (read with the stats).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sandboxd.commands import Plain, SandboxCommands, Where
from sandboxd.digits import decimal
from sandboxd.engine.protocol import Engine, SandboxStats
from sandboxd.errors import SandboxError
from sandboxd.events.hub import EventHub
from sandboxd.events.observed_store import state_name
from sandboxd.models import Session, SessionState
from sandboxd.store import SessionStore

log = logging.getLogger(__name__)

NEARLY_FULL = 0.9  # WORKSPACE_NEARLY_FULL at this share of workspace_bytes
THROTTLED = 0.5  # CPU_THROTTLED when throttled for this share of the time between two readings
DF_TIMEOUT_S = 5.0
MAX_TRACKED = 10_000  # sessions whose last reading is remembered


@dataclass(frozen=True)
class SessionStats:
    cpu_seconds: float = 0.0
    memory_bytes: int = 0
    memory_peak_bytes: int = 0
    workspace_bytes: int = 0
    processes: int = 0
    egress_bytes: int = 0


async def workspace_used(commands: SandboxCommands, session: Session) -> int:
    """Bytes used in the workspace (a tmpfs of its own: `df` of it is exact and cheap)."""
    out = bytearray()
    async with asyncio.timeout(DF_TIMEOUT_S):
        async with commands.open(
            Where(session.container_id, session.spec.user), Plain(("df", "-P", "-k", "/workspace"))
        ) as stream:
            while (chunk := await stream.read()) is not None:
                if chunk[0] == 1 and len(out) < 4096:
                    out += chunk[1]
    lines = out.decode(errors="replace").strip().splitlines()
    fields = lines[-1].split() if len(lines) >= 2 else []
    used = decimal(fields[2]) if len(fields) >= 3 else None
    return used * 1024 if used is not None else 0


class StatsReader:
    def __init__(
        self,
        engine: Engine,
        hub: EventHub,
        egress_bytes: Callable[[str], int] | None = None,
        *,
        commands: SandboxCommands,
    ) -> None:
        self._engine = engine
        self._commands = commands  # the workspace's `df`
        self._hub = hub
        # Sandboxes have no interface but loopback: their egress is what their proxy moved.
        self._egress_bytes = egress_bytes
        self._full_warned: set[str] = set()
        self._throttle: dict[str, tuple[float, float]] = {}  # session -> (throttled s, at)

    async def read(self, session: Session) -> SessionStats:
        if session.state is not SessionState.RUNNING or not session.container_id:
            return SessionStats()
        raw: SandboxStats = await self._engine.sandbox_stats(session.container_id)
        used = 0
        with contextlib.suppress(SandboxError, TimeoutError, ValueError):
            used = await workspace_used(self._commands, session)
        self._note_workspace(session, used)
        self._note_throttling(session, raw.cpu_throttled_s)
        return SessionStats(
            cpu_seconds=raw.cpu_seconds,
            memory_bytes=raw.memory_bytes,
            memory_peak_bytes=raw.memory_peak_bytes,
            workspace_bytes=used,
            processes=raw.processes,
            egress_bytes=raw.network_bytes
            + (self._egress_bytes(session.session_id) if self._egress_bytes else 0),
        )

    def _note_throttling(self, session: Session, throttled_s: float) -> None:
        """Between two readings of a session's stats (no polling: readings are on demand)."""
        now = time.monotonic()
        before = self._throttle.get(session.session_id)
        if len(self._throttle) > MAX_TRACKED:
            self._throttle.clear()  # bounded: a reading after this starts afresh
        self._throttle[session.session_id] = (throttled_s, now)
        if before is None or now <= before[1]:
            return
        share = (throttled_s - before[0]) / (now - before[1])
        if share >= THROTTLED:
            self._warn(
                session,
                "CPU_THROTTLED",
                f"throttled {share:.0%} of the time since the last reading",
                throttled_share=f"{share:.2f}",
                cpu_millis=session.spec.limits.cpu_millis,
            )

    def _note_workspace(self, session: Session, used: int) -> None:
        cap = session.spec.limits.workspace_bytes
        full = cap > 0 and used >= NEARLY_FULL * cap
        if len(self._full_warned) > MAX_TRACKED:
            self._full_warned.clear()
        if full and session.session_id not in self._full_warned:
            self._full_warned.add(session.session_id)
            text = f"{used} of {cap} workspace bytes used"
            self._warn(session, "WORKSPACE_NEARLY_FULL", text, used_bytes=used, limit_bytes=cap)
        elif not full:
            self._full_warned.discard(session.session_id)

    def _warn(self, session: Session, kind: str, message: str, **attributes: object) -> None:
        """A warning a reading found, on the session's event feed with its state now."""
        state = state_name(session)
        tenant, sid = session.tenant, session.session_id
        self._hub.publish(tenant, sid, kind, state=state, message=message, **attributes)


class OomWatcher:
    """OOM_KILLED on the session's feed for every OOM kill the engine reports in its sandbox."""

    def __init__(self, engine: Engine, store: SessionStore, hub: EventHub, owner_id: str) -> None:
        self._engine = engine
        self._store = store
        self._hub = hub
        self._owner_id = owner_id

    async def _session_of(self, sandbox_id: str) -> Session | None:
        for row in await self._store.index():
            if row.container_id and (
                row.container_id == sandbox_id or sandbox_id.startswith(row.container_id)
            ):
                return await self._store.get(row.session_id)
        return None

    async def run(self, retry_s: float = 5.0) -> None:
        while True:
            try:
                async for sandbox_id in self._engine.oom_kills(self._owner_id):
                    session = await self._session_of(sandbox_id)
                    if session is None:
                        continue
                    log.warning("OOM kill in the sandbox", extra={"session_id": session.session_id})
                    self._hub.publish(
                        session.tenant,
                        session.session_id,
                        "OOM_KILLED",
                        state=state_name(session),
                        message="a process was killed: the session's memory limit was reached",
                        memory_limit_bytes=session.spec.limits.memory_bytes,
                    )
            except SandboxError as exc:
                log.info("engine events unavailable (%s); retrying", exc.message)
            except Exception:
                log.exception("OOM watch failed; retrying")
            await asyncio.sleep(retry_s)
