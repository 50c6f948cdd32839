"""The label keys sandboxd writes on engine objects and snapshots: defined here, once.

Containers, networks and images carry `LABEL_OWNER` so a server only ever touches its own;
the others say which session, pool generation or snapshot an object belongs to.
"""

from __future__ import annotations

LABEL_PREFIX = "io.sandboxd."  # every key below, and the templates' (templates/builds.py)
LABEL_OWNER = "io.sandboxd.owner"
LABEL_SESSION = "io.sandboxd.session"
LABEL_FINGERPRINT = "io.sandboxd.fingerprint"
LABEL_POOL = "io.sandboxd.pool"
LABEL_SNAPSHOT = "io.sandboxd.snapshot"
# On the never-started container an IMAGE snapshot is committed from (engine/docker_commit.py).
LABEL_COMMIT_OF = "io.sandboxd.commit-of"
# On snapshots (not engine objects): set on those the server takes by itself, and on a fork's
# own record of the snapshot it started from.
LABEL_AUTO = "io.sandboxd.auto"
LABEL_FORKED_FROM = "io.sandboxd.forked-from"
# On the engine's own short-lived work containers (a disk tool run, a checkpoint carrier): what
# work it does, and the run of the server process that made it (engine/work_containers.py).
LABEL_WORK = "io.sandboxd.work"
LABEL_WORK_RUN = "io.sandboxd.work-run"
# On a runc sandbox's agent socket volume (engine/agent_socket.py): the container it is for.
LABEL_AGENT_SOCKET = "io.sandboxd.agent-socket"
WORK_DISK_TOOL = "disk-tool"  # the values of LABEL_WORK
WORK_CHECKPOINT_CARRIER = "checkpoint-carrier"
