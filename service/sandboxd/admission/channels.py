"""The agent router's view of the fair shares (agent/router.py's `ChannelShares` protocol).

A sandbox's channel spends its tenant's output share. The tenant is read from the sandbox's
session label when ids are partitioned (a tokens file: `<tenant>.<name>`); a warm container has
no session label (labels are fixed at create, before any session claims it), so its tenant is
the caller of the first command on it: a sandbox is only ever used by its own tenant's calls.
"""

from __future__ import annotations

from sandboxd import tenancy
from sandboxd.admission.shares import FairShares


class ChannelShares:
    def __init__(self, shares: FairShares, *, partitioned: bool) -> None:
        self._shares = shares
        self._partitioned = partitioned

    def tenant_of_label(self, session_id: str) -> str:
        if not session_id:
            return ""
        return tenancy.tenant_of_session(session_id, self._partitioned)

    def calling_tenant(self) -> str:
        return tenancy.current() if self._partitioned else tenancy.DEFAULT_TENANT

    def delay(self, tenant: str, nbytes: int) -> float:
        return self._shares.output_delay(tenant, nbytes)
