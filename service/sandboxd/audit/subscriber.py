"""The audit log's subscription to the domain's events: each audited event becomes one record.

A record made in a call (the call's scope is open) carries the call's method and trace id and is
deferred to the call: the gRPC edge answers only once the writer acknowledged it, so an answered
call's record survives a SIGKILL, and a record the log cannot take fails the call UNAVAILABLE.
What happens outside any call (a background process's exit, an egress decision, a state change
the server made on its own) is queued without blocking anyone.
"""

from __future__ import annotations

import time

from sandboxd import domain_events as de
from sandboxd.audit.events import AuditEvent
from sandboxd.audit.writer import AuditWriter


class AuditSubscriber:
    def __init__(self, writer: AuditWriter) -> None:
        self._writer = writer

    def __call__(self, event: de.DomainEvent) -> None:
        if isinstance(event, de.EgressDecided):
            self._writer.record_nowait(_egress(event))  # never blocks a proxied connection
        elif isinstance(event, de.CommandExited) and event.background:
            # Its StartProcess call has its own record (of the start); this one is no call's.
            self._writer.record_nowait(_background_exit(event))
        elif isinstance(event, de.SessionChanged):
            if de.current_call() is None:  # a caller's own change is audited with its call
                self._writer.record_nowait(
                    AuditEvent.of(
                        "lifecycle",
                        time=time.time(),
                        tenant=event.tenant,
                        session_id=event.session_id,
                        action="server",
                        state=event.state,
                    )
                )
        else:
            described = _described(event)
            if described is not None:
                self._in_call(event.tenant, *described)

    def _in_call(self, tenant: str, kind: str, session_id: str, attrs: dict[str, object]) -> None:
        scope = de.current_call()
        record = AuditEvent.of(
            kind,
            time=time.time(),
            tenant=tenant,
            session_id=session_id,
            trace_id=scope.trace_id if scope is not None else "",
            method=scope.method if scope is not None else None,
            **attrs,
        )
        if scope is not None and scope.open:
            scope.defer(self._writer.record(record))
        else:
            self._writer.record_nowait(record)


def kind_of(event: de.DomainEvent) -> str | None:
    """The kind of the audit record `event` makes where it is emitted now (None: it makes
    none), whether the audit log is on or off: what the per-tenant metrics count."""
    if isinstance(event, de.EgressDecided):
        return event.kind
    if isinstance(event, de.CommandExited) and event.background:
        return "command"
    if isinstance(event, de.SessionChanged):
        return "lifecycle" if de.current_call() is None else None
    described = _described(event)
    return described[0] if described is not None else None


def _described(event: de.DomainEvent) -> tuple[str, str, dict[str, object]] | None:
    """(kind, session id, attributes) of an event a caller's call made, or None: not audited."""
    if isinstance(event, de.CommandStarted):
        return _command_started(event)
    if isinstance(event, de.CommandExited):
        return "command", event.session_id, _command_exited(event)
    if isinstance(event, de.CallRefused):
        return "refused", event.session_id, _refused(event)
    if isinstance(event, de.FileWritten):
        attrs: dict[str, object] = {
            "path": event.path,
            "bytes": event.bytes,
            "mode": event.mode,
            "size": event.size,
        }
        return "file_write", event.session_id, attrs
    if isinstance(event, de.DirectoryMade):
        return "file_write", event.session_id, {"path": event.path, "type": "directory"}
    if isinstance(event, de.FileRemoved):
        attrs = {"path": event.path, "recursive": event.recursive}
        return "file_remove", event.session_id, attrs
    if isinstance(event, de.FileMoved):
        attrs = {
            "path": event.destination,
            "source": event.source,
            "action": "move",
            "overwrite": event.overwrite,
            "size": event.size,
        }
        return "file_write", event.session_id, attrs
    if isinstance(event, de.ProcessInputSent):
        action = "close_process_stdin" if event.closed else "send_process_input"
        attrs = {"action": action, "process_id": event.process_id}
        if not event.closed:
            attrs["bytes"] = event.bytes
        return "lifecycle", event.session_id, attrs
    if isinstance(event, de.ProcessSignalled):
        attrs = {"action": "signal_process", "process_id": event.process_id, "signal": event.signal}
        return "lifecycle", event.session_id, attrs
    if isinstance(event, de.PortPublished):
        attrs = {
            "action": "publish",
            "port": event.port,
            "public": event.public,
            "expires_at": f"{event.expires_at:.3f}",
        }
        return "preview", event.session_id, attrs
    if isinstance(event, de.PortUnpublished):
        return "preview", event.session_id, {"action": "unpublish", "port": event.port}
    if isinstance(event, de.TemplateBuilt):
        attrs = {
            "action": "build_template",
            "template": event.name,
            "image": event.image,
            "size_bytes": event.size_bytes,
        }
        return "lifecycle", "", attrs
    if isinstance(event, de.TemplateDeleted):
        return "lifecycle", "", {"action": "delete_template", "template": event.name}
    if isinstance(event, de.ImagePulled):
        attrs = {"action": "pull_image", "image": event.image, "digest": event.digest or None}
        return "lifecycle", "", attrs
    if isinstance(event, de.VolumeMoved):
        attrs = {"volume_id": event.volume_id, "tar_bytes": event.tar_bytes}
        if event.imported:
            attrs["replace"] = event.replace
        return ("archive_import" if event.imported else "archive_export"), "", attrs
    if isinstance(event, de.ArchiveExported):
        attrs = {"path": event.path, "tar_bytes": event.tar_bytes, "sha256": event.sha256}
        if event.compression:
            attrs["compression"] = event.compression
        return "archive_export", event.session_id, attrs
    if isinstance(event, de.ArchiveImported):
        attrs = {
            "path": event.path,
            "replace": event.replace,
            "files": event.files,
            "bytes_written": event.bytes_written,
            "tar_bytes": event.tar_bytes,
            "sha256": event.sha256,
        }
        if event.compression:
            attrs["compression"] = event.compression
        return "archive_import", event.session_id, attrs
    caller_act = (de.SessionActed, de.SnapshotTaken, de.SnapshotDeleted)
    if isinstance(event, caller_act) and de.current_call() is None:
        return None  # the server's own (a checkpoint): its state changes are recorded instead
    if isinstance(event, de.SessionActed):
        attrs = {"action": event.action}
        if event.action == "create":
            attrs["image"] = event.image
        return "lifecycle", event.session_id, attrs
    if isinstance(event, de.SnapshotTaken):
        attrs = {
            "action": "create",
            "snapshot_id": event.snapshot_id,
            "size_bytes": event.size_bytes,
            "sha256": event.sha256 or None,
            "image": event.image or None,
        }
        return "snapshot", event.session_id, attrs
    if isinstance(event, de.SnapshotDeleted):
        return "lifecycle", "", {"action": "delete_snapshot", "snapshot_id": event.snapshot_id}
    if isinstance(event, de.VolumeCreated):
        return "lifecycle", "", {"action": "create_volume", "volume_id": event.volume_id}
    if isinstance(event, de.VolumeDeleted):
        return "lifecycle", "", {"action": "delete_volume", "volume_id": event.volume_id}
    if isinstance(event, de.Swept):
        if de.current_call() is None:
            return None  # the server's own sweeps: counted by the metrics, not a caller's act
        attrs = {
            "action": "sweep",
            "expired_sessions": event.expired_sessions,
            "removed_containers": event.removed_containers,
            "removed_images": event.removed_images,
            "removed_networks": event.removed_networks,
            "removed_volume_disks": event.removed_volume_disks,
        }
        return "lifecycle", "", attrs
    return None


def _command_started(e: de.CommandStarted) -> tuple[str, str, dict[str, object]] | None:
    """A background process's start is its StartProcess call's record (once: a retry that
    found the process started nothing); a foreground command's record is made at its exit."""
    if not e.background:
        return None
    attrs: dict[str, object] = {
        "argv": list(e.argv),
        "cwd": e.cwd,
        "background": True,
        "process_id": e.process_id,
        "request_id": e.request_id or None,
    }
    return "command", e.session_id, attrs


def _command_exited(e: de.CommandExited) -> dict[str, object]:
    """An Exec's, Run's or Interact's record (its call's), or a background process's exit."""
    attrs: dict[str, object] = {"argv": list(e.argv), "cwd": e.cwd}
    if e.background:
        attrs["background"] = True
    attrs.update(
        process_id=e.process_id,
        exit_code=e.exit_code,
        signal=e.signal or None,
        timed_out=e.timed_out,
        truncated=e.truncated,
        duration_s=f"{e.duration_s:.3f}",
        stdout_bytes=e.stdout_bytes,
        stderr_bytes=e.stderr_bytes,
    )
    if e.origin in ("exec", "interact"):  # their records always had the sum of both streams
        attrs["output_bytes"] = e.stdout_bytes + e.stderr_bytes
    if e.origin == "interact":
        attrs["pty"] = e.pty
    return attrs


def _refused(e: de.CallRefused) -> dict[str, object]:
    return {"code": e.code, "reason": e.reason or None, "message": e.message or None}


def _background_exit(e: de.CommandExited) -> AuditEvent:
    """A background process ended (its StartProcess call has its own record, committed when
    it answered, which may be after this one)."""
    return AuditEvent.of(
        "command",
        time=time.time(),
        tenant=e.tenant,
        session_id=e.session_id,
        trace_id="",
        **_command_exited(e),
    )


def _egress(e: de.EgressDecided) -> AuditEvent:
    return AuditEvent.of(
        e.kind,  # egress, or secret_injected / secret_misdirected (by name, no value)
        time=e.time,
        tenant=e.tenant,
        session_id=e.session_id,
        method=e.method,
        host=e.host,
        port=e.port,
        verdict="allowed" if e.allowed else "refused",
        rule=e.reason or None,
        address=e.address or None,
        secret=e.secret or None,
    )
