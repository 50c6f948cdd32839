"""The durable audit log: who ran what, when, and what came of it.

`AuditWriter` takes events from the call paths and acknowledges each only after its batch is
committed to the audit database (and appended to the JSON Lines export); callers await that
acknowledgement before they answer, so an answered call's event survives a SIGKILL.
`AuditLog` reads them back for ListAuditEvents with the tenant's scope applied.
"""

from sandboxd.audit.events import KINDS, AuditEvent, AuditQuery
from sandboxd.audit.log import AuditLog
from sandboxd.audit.store import AuditStore
from sandboxd.audit.writer import AuditWriter

__all__ = ["KINDS", "AuditEvent", "AuditLog", "AuditQuery", "AuditStore", "AuditWriter"]
