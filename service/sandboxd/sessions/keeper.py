"""What sessions need of snapshots, as a protocol: sessions never import the snapshots.

The implementation (`sandboxd.snapshot_keeper.SnapshotKeeper`) is built before the SessionManager
and passed to its constructor; the SnapshotService's own domain (`Snapshots`) is built after
and uses both, so there is no cycle to wire by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from sandboxd.models import Session
from sandboxd.snapshot_store import Snapshot


class WorkspaceKeeper(Protocol):
    async def take(
        self, session: Session, labels: Mapping[str, str], *, image: bool = False
    ) -> Snapshot: ...

    async def latest(self, session_id: str) -> Snapshot | None: ...

    async def restore(self, session: Session, snap: Snapshot) -> None: ...

    async def lookup(self, snapshot_id: str) -> Snapshot:
        """The snapshot if the caller's tenant may see it; NOT_FOUND otherwise."""
        ...

    async def adopt(self, snap: Snapshot, session: Session) -> Snapshot: ...

    async def forget_session(self, session_id: str) -> None: ...

    async def tidy(self, session: Session) -> None:
        """Remove what an operation cut short by a dead server left in the workspace."""
        ...

    async def images_of(self, tenant: str) -> list[str]:
        """Image ids of the tenant's image snapshots: the only snapshot images it may run."""
        ...
