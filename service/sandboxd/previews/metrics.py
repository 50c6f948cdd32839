"""The previews' Prometheus series, on the server's registry (`Metrics.registry`):
preview_requests_total{code}          preview requests by HTTP status (0: the client left)
preview_request_seconds               histogram of a request until its answer ended
preview_bytes_total{direction}        bytes relayed: in (to sandboxes), out (to clients)
preview_connections                   open client connections of the preview listener
preview_refused_connections_total{why} client connections closed before a request was served:
                                      listener_full, source_full, evicted (the oldest pending
                                      one, for a newer), rebalanced (an admitted one of the
                                      tenant holding the most, for another tenant's),
                                      head_timeout, tenant_full
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class PreviewMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "sandboxd_preview_requests_total",
            "Preview requests by status",
            ["code"],
            registry=registry,
        )
        self.duration = Histogram(
            "sandboxd_preview_request_seconds",
            "Preview requests until their answer ended",
            registry=registry,
        )
        self.bytes = Counter(
            "sandboxd_preview_bytes_total",
            "Bytes relayed by previews",
            ["direction"],
            registry=registry,
        )
        self.refused = Counter(
            "sandboxd_preview_refused_connections_total",
            "Preview client connections closed before a request was served, by why",
            ["why"],
            registry=registry,
        )
        self.connections = Gauge(
            "sandboxd_preview_connections", "Open preview client connections", registry=registry
        )
