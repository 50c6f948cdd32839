"""The fair shares' Prometheus series, on the server's registry (`Metrics.registry`):
fair_share_refused_calls_total{tenant}  calls refused TENANT_RATE_LIMITED
fair_share_paced_seconds_total{tenant}  time the tenant's agent channels waited before reading
Tenants are the tokens file's (a bounded set); a tenant alone never appears here.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class ShareMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.refused = Counter(
            "sandboxd_fair_share_refused_calls_total",
            "Calls refused because the tenant was over its share while others were active",
            ["tenant"],
            registry=registry,
        )
        self.paced = Counter(
            "sandboxd_fair_share_paced_seconds_total",
            "Seconds the tenant's agent channels waited before reading, over its output share",
            ["tenant"],
            registry=registry,
        )
