"""Fair shares between tenants: call admission and the pacing of command output (shares.py).

`FairShares` is built once per server (server/parts.py) from `AdmissionSection`; the gRPC
interceptor `api/admission.py` admits each call, and each agent channel is given its tenant's
pacer (agent/router.py). Nothing here imports gRPC or the agent package.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from sandboxd.admission.bucket import TokenBucket
from sandboxd.admission.channels import ChannelShares
from sandboxd.admission.metrics import ShareMetrics
from sandboxd.admission.shares import FairShares, RateLimited, Shares
from sandboxd.config_sections.admission import AdmissionSection

__all__ = [
    "AdmissionSection",
    "ChannelShares",
    "FairShares",
    "RateLimited",
    "Shares",
    "TokenBucket",
    "shares_of",
]


def shares_of(
    section: AdmissionSection, registry: CollectorRegistry | None = None
) -> FairShares | None:
    """The server's fair shares from its settings (their series on `registry`); None when
    they are turned off."""
    if not section.enabled:
        return None
    return FairShares(
        Shares(
            calls_per_s=float(section.calls_per_s),
            call_burst=float(section.call_burst),
            output_bytes_per_s=float(section.output_bytes_per_s),
            output_burst_bytes=float(section.output_burst_bytes),
            window_s=section.contention_window_s,
        ),
        metrics=ShareMetrics(registry) if registry is not None else None,
    )
