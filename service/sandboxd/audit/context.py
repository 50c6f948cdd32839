"""Which RPC the running task serves ("" outside any call): set by the audit interceptor, read
by the domain to tell a change a caller asked for (audited with that call) from one the server
made on its own (the reaper's expiry, a lost container), which gets an event of its own."""

from __future__ import annotations

from contextvars import ContextVar

CURRENT_CALL: ContextVar[str] = ContextVar("sandboxd_audit_call", default="")
