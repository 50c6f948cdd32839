"""Sessions: a create request checked (`spec`) and carried out (`creation`), the lifecycle
(`lifecycle`), sandboxes on the engine (`sandboxes`), leases and lost sandboxes (`recovery`),
a live session's network (`network`), quotas and manifests."""

from sandboxd.sessions.keeper import WorkspaceKeeper
from sandboxd.sessions.lifecycle import SessionManager
from sandboxd.sessions.manifest import build_manifest_tar
from sandboxd.sessions.spec import CreateSessionInput, resolve_limits

__all__ = [
    "CreateSessionInput",
    "SessionManager",
    "WorkspaceKeeper",
    "build_manifest_tar",
    "resolve_limits",
]
